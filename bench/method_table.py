"""`omnidraft bench`: the paper's tables in miniature on one backend, in one process and one pass.

Sections run in order (method rows per stream, cache eviction, peers) and the report is rewritten
when the run ends, also on Ctrl-C: the rows finished so far are kept and ``interrupted`` is set; a
run cut short mid-way is dropped rather than reported with fewer prompts. The schema is documented
in bench/SCHEMA.md.
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omnidraft.atomic import check_writable, write_json, write_text
from omnidraft.bench import adapted_rows, environment, table_rows
from omnidraft.bench.cache_table import GrowthTracker, eviction_rows, growth_summary, measure_cache
from omnidraft.bench.demo import DRAFTER_DEVICES
from omnidraft.bench.engine import Engine, Pair, interleave, resolve_pair, set_threads
from omnidraft.bench.metrics import PAPER_LATENCY_S
from omnidraft.bench.settings import LOOKUP, BenchSettings, validate
from omnidraft.bench.streams_eval import StreamRun
from omnidraft.errors import OmnidraftError
from omnidraft.models.streams import load_stream
from omnidraft.runtime.answer_memory import AnswerMemory
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.draft_length.controller import GammaController
from omnidraft.runtime.draft_length.head_file import ET_NO_HEAD
from omnidraft.runtime.draft_length.policy import has_accept_head

SCHEMA = "omnidraft.bench"
SCHEMA_VERSION = 1
METHODS = (
    "target-only",
    "spd-dm",
    "spd-dm+ngram",
    "spd-dm+ngram_pp",
    "l-dm",
    "hybrid",
    "hybrid+lora",
    "hybrid+adaptive",
)
# Rows that get a +lookup twin (bench/settings.py LOOKUP); hybrid+adaptive's controller tunes drafting
# alone, so it has none.
LOOKUP_BASES = ("spd-dm+ngram_pp", "l-dm", "hybrid", "hybrid+lora")


def new_report(s: BenchSettings) -> dict:
    settings = {
        k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v) for k, v in asdict(s).items()
    }
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "interrupted": False,
        "meta": {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "versions": environment.versions(),
            "machine": environment.machine(),
            "settings": settings,
            "paper_latency_s": PAPER_LATENCY_S,
        },
        "rows": [],
        "sweep": [],
        "projected": [],
        "peers": [],
        "verify_cost": [],
        "cache": {"tables": [], "growth": {}, "eviction": []},
        "checks": {},
        "plots": [],
    }


@dataclass
class _Stream:
    """What later sections need from a stream's method rows."""

    name: str
    prompts: list[str]
    draft_len: int
    base: StreamRun | None = None
    runs: dict[str, StreamRun] = field(default_factory=dict)
    ks: dict[str, int] = field(default_factory=dict)  # adapted rows' own best fixed K
    full_cache_entries: int = 0
    pp_cache: Path | None = None
    pp_memory: Path | None = None
    pp_prompts: int = 0


@dataclass
class _Rows:
    """A stream's rows before they run: their jobs, why the others do not run, what each row's cache
    is and what its adaptation pass reported."""

    jobs: list = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    extra: dict[str, dict] = field(default_factory=dict)
    trackers: dict[str, GrowthTracker] = field(default_factory=dict)


class Bench:
    def __init__(self, s: BenchSettings, report: dict, progress: bool = True) -> None:
        self.s, self.report, self.progress = s, report, progress
        self.pair: Pair | None = None
        self.engines: dict[str, Engine] = {}
        self.streams: list[_Stream] = []
        self.hf = None  # HFPeers, loaded when the peers section first needs it
        self.llamacpp = None  # LlamaCppPeers, likewise
        self.genai = None  # OrtGenaiPeer, likewise
        self.adapted: dict = {}  # (stream, method) -> adaptation pass results (bench/adapted_rows.py)
        self.warm_prompt = ""

    def engine(self, backend: str) -> Engine:
        """The backend's pair, loaded (and exported, for ort/executorch) and warmed up on first use."""
        if backend not in self.engines:
            tq = self.s.target_quant if backend == self.s.backend else None
            d, t = self.pair.paths(backend, self.s.max_seq_len, self.progress, self.s.draft_vocab, tq)
            eng = Engine(backend, d, t, self.s.threads, self.s.splits)
            if eng.executorch_threads is not None:
                self.report["meta"]["threads"]["executorch"] = eng.executorch_threads
            eng.warm_up(self.warm_prompt)
            self.engines[backend] = eng
        return self.engines[backend]

    def _add(self, key: str, obj: dict) -> None:
        self.report[key].append(obj)

    def run(self) -> None:
        s = self.s
        tests = {n: load_stream(n, "test", target=self.pair.target) for n in s.streams}
        self.warm_prompt = tests[s.streams[0]][0].prompt[:200]
        eng = self.engine(s.backend)
        self.report["meta"]["pair"] = {
            "name": self.pair.name,
            "drafter": str(self.pair.drafter),
            "target": str(self.pair.target),
            "drafter_artifact": str(eng.paths[0]),
            "target_artifact": str(eng.paths[1]),
        }
        for name in s.streams:
            self.streams.append(self.method_rows(eng, name, tests[name]))
        if s.eviction:
            for st in self.streams:
                self.eviction(eng, st)
        for st in self.streams:
            self.peers(st)
        if s.verify_repeats:
            from omnidraft.bench import verify_cost

            for e in self.engines.values():
                self.report["verify_cost"].append(verify_cost.measure(e, repeats=s.verify_repeats))

    def _pick(self, eng: Engine, prompts, count: int) -> list[str]:
        k_max = max(*self.s.sweep_ks, DecodeConfig().max_draft_len)  # hybrid+adaptive drafts up to K_max
        return [p.prompt for p in prompts if eng.fits(p.prompt, self.s.max_new_tokens, k_max)][:count]

    def sweep(
        self, eng: Engine, name: str, train, method: str = "untrained", drafter=None, new_cache=None, skip: int = 0
    ) -> int:
        """Best fixed K (tokens/s) on train prompts so the test split stays unseen; the K runs are
        interleaved like every timed comparison. Untrained: the drafter with a cache filled online.
        Adapted rows sweep again with their own drafter and a fresh copy of their pass's cache, on train
        prompts after the ``skip`` the pass trained on: a trained drafter's best K differs."""
        s = self.s
        prompts = self._pick(eng, train[skip:], s.sweep_prompts) or self._pick(eng, train, s.sweep_prompts)
        jobs = [
            eng.job(
                f"K={k}",
                prompts,
                "ngram",
                k,
                s.max_new_tokens,
                cache=new_cache() if new_cache else None,
                drafter=drafter,
            )
            for k in s.sweep_ks
        ]
        runs = interleave(jobs, len(prompts), f"{name}: K sweep ({method})", self.progress)
        for k in s.sweep_ks:
            run = runs[f"K={k}"]
            self._add(
                "sweep",
                {
                    "stream": name,
                    "method": method,
                    "backend": s.backend,
                    "draft_len": k,
                    "prompts": run.prompts,
                    "tokens_per_s": round(run.tokens_per_s, 2),
                    "acceptance_rate": round(run.stats.acceptance_rate, 4),
                },
            )
        return max(s.sweep_ks, key=lambda k: runs[f"K={k}"].tokens_per_s)

    def tune_controller(self, eng: Engine, name: str, train, drafter, ctl, skip: int) -> dict:
        """Run hybrid+adaptive's controller over train prompts after the ``skip`` the pass trained on
        (untimed, on a throwaway copy of the pass's cache), so the timed row starts where the controller
        settles on this backend, drafting off included, as the fixed-K rows start from the swept K."""
        path = self.adapted.get((name, "hybrid+adaptive"), {}).get("cache")
        cache = eng.load_cache(Path(path)) if path else eng.new_cache()
        prompts = self._pick(eng, train[skip:], self.s.tune_prompts)
        if prompts:
            job = eng.job(
                "tune",
                prompts,
                "ngram",
                "auto",
                self.s.max_new_tokens,
                cache=cache,
                drafter=drafter,
                gamma=ctl.gamma,
                tune=ctl,
            )
            interleave([job], len(prompts), f"{name}: tune hybrid+adaptive (train)", self.progress)
        return {
            "prompts": len(prompts),
            "gamma": round(ctl.gamma, 4),
            "k_max": ctl.k_max,
            "drafting": "off" if ctl.k_max == 0 else "on",
        }

    def method_rows(self, eng: Engine, name: str, test_prompts) -> _Stream:
        s = self.s
        prompts = self._pick(eng, test_prompts, s.prompts)
        if len(prompts) < s.prompts:
            print(f"bench: {name}: only {len(prompts)} test prompts fit max_seq_len {s.max_seq_len}", file=sys.stderr)
        train = load_stream(name, "train", target=self.pair.target)
        st = _Stream(name, prompts, self.sweep(eng, name, train))
        # Untimed passes first (cache pre-collection, adaptation), then all rows timed in lockstep.
        rows = self.cache_jobs(eng, st, train)
        for method in adapted_rows.METHODS:
            self.adapted_job(eng, st, train, method, rows)
        rows.jobs += self.lookup_jobs(eng, st, rows.jobs, rows.kinds)
        runs = interleave(rows.jobs, len(prompts), f"{name}: {len(rows.jobs)} rows in lockstep", self.progress)
        st.base = runs["target-only"]
        for method in (*METHODS, *(m + LOOKUP for m in LOOKUP_BASES)):
            if method not in runs:
                if not method.endswith(LOOKUP):
                    self._add(
                        "rows", table_rows.unavailable(name, method, s.backend, rows.status.get(method, "not run"))
                    )
                continue
            row = table_rows.method_row(name, method, s.backend, runs[method], st.base, rows.kinds.get(method))
            row.update(rows.extra.get(method, {}))
            self._add("rows", row)
            if method != "target-only":
                self._add("projected", table_rows.projected(row))
            st.runs[method] = runs[method]
        self.cache_tables(eng, st, runs, rows)
        return st

    def cache_jobs(self, eng: Engine, st: _Stream, train) -> _Rows:
        """The rows without adaptation: target-only, spd-dm, the online cache from empty, and the cache
        (and answer memory) pre-collected on train prompts."""
        s, k, mnt, prompts = self.s, st.draft_len, self.s.max_new_tokens, st.prompts
        rows = _Rows([eng.job("target-only", prompts, "target-only", k, mnt), eng.job("spd-dm", prompts, "dm", k, mnt)])
        tracker = rows.trackers["spd-dm+ngram"] = GrowthTracker(eng.new_cache())
        rows.jobs.append(eng.job("spd-dm+ngram", prompts, "ngram", k, mnt, cache=tracker.cache, on_verified=tracker))
        rows.kinds["spd-dm+ngram"] = "online on the test prompts, from empty"
        if not s.train_prompts:
            rows.status["spd-dm+ngram_pp"] = "not run: --train-prompts 0"
            return rows
        tracker = rows.trackers["spd-dm+ngram_pp"] = GrowthTracker(eng.new_cache())
        pre = self._pick(eng, train, s.train_prompts)
        memory = eng.new_memory()
        eng.run(
            pre, "ngram", k, mnt, f"{st.name}: pre-collect cache (train)", tracker.cache, tracker, self.progress,
            memory=memory,
        )  # fmt: skip
        st.pp_cache = s.out / "state" / f"ngram_cache.{st.name}.train.json"
        tracker.cache.save(st.pp_cache)
        st.pp_memory = s.out / "state" / f"answer_memory.{st.name}.train.json"
        memory.save(st.pp_memory)
        st.pp_prompts = len(pre)
        rows.jobs.append(eng.job("spd-dm+ngram_pp", prompts, "ngram", k, mnt, cache=tracker.cache, on_verified=tracker))
        rows.kinds["spd-dm+ngram_pp"] = f"pre-collected on {len(pre)} train prompts, then online"
        return rows

    def _skip_reason(self, method: str) -> str | None:
        """Why an adapted row does not run in this bench (None: it runs)."""
        s = self.s
        if reason := adapted_rows.unavailable_reason():
            return reason
        if method == "hybrid+adaptive" and s.backend == "executorch":
            return f"not available: {ET_NO_HEAD} (use --backend ort or torch)"
        if not s.adapt_prompts:
            return (
                "not run: --quick skips adaptation (add --adapt-prompts N)" if s.quick else "not run: --adapt-prompts 0"
            )
        if s.adapted is not None and method not in s.adapted:
            return "not run: --adapted leaves it out"
        return None

    def adapted_job(self, eng: Engine, st: _Stream, train, method: str, rows: _Rows) -> None:
        """One adapted row: its pass over the train prompts, then its job (or why it has none)."""
        s, name = self.s, st.name
        reason = self._skip_reason(method)
        if reason:
            rows.status[method] = reason
            return
        try:
            drafter, cache, summary = adapted_rows.adapt(self, eng, name, method, train, st.draft_len)
        except Exception as exc:  # noqa: BLE001 -- one failed pass becomes a failure row, not a lost bench
            rows.status[method] = f"failed: {exc if isinstance(exc, OmnidraftError) else repr(exc)}".splitlines()[0]
            return
        if method == "hybrid+adaptive" and not has_accept_head(drafter.backend):
            rows.status[method] = "failed: the adaptation pass left no acceptance head on the drafter"
            return
        rows.kinds[method] = "built during adaptation (train), then online"
        rows.extra[method] = {"adaptation": summary}
        eng.warm_up(self.warm_prompt, drafter)
        if method == "hybrid+adaptive":
            # From --gamma and K_max 16, not the pass's final setting: the pass drafts with the eager
            # drafter (~5x the exported drafter's cost per call), so its setting is biased short.
            ctl = GammaController(gamma=s.gamma, k_max=DecodeConfig().max_draft_len)
            rows.extra[method]["tuning"] = self.tune_controller(
                eng, name, train, drafter, ctl, summary["train_prompts"]
            )
            rows.jobs.append(
                eng.job(
                    method, st.prompts, "ngram", "auto", s.max_new_tokens, cache=cache, drafter=drafter,
                    gamma=ctl.gamma, tune=ctl,
                )
            )  # fmt: skip
            return
        path = self.adapted.get((name, method), {}).get("cache")
        k = st.ks[method] = self.sweep(
            eng,
            name,
            train,
            method,
            drafter,
            lambda path=path: eng.load_cache(Path(path)) if path else eng.new_cache(),
            skip=summary["train_prompts"],
        )
        rows.jobs.append(eng.job(method, st.prompts, "ngram", k, s.max_new_tokens, cache=cache, drafter=drafter))

    def cache_tables(self, eng: Engine, st: _Stream, runs: dict, rows: _Rows) -> None:
        """Growth and content of the two caches that filled while their rows ran."""
        by_name = {j.name: j for j in rows.jobs}
        for method, source, n in (
            ("spd-dm+ngram", "online (test)", len(st.prompts)),
            ("spd-dm+ngram_pp", "train then test", st.pp_prompts + len(st.prompts)),
        ):
            if method in runs:
                tracker = rows.trackers[method]
                self.report["cache"]["growth"][f"{st.name}: {source}"] = tracker.finish()
                self.report["cache"]["tables"].append(
                    {
                        "stream": st.name,
                        "source": source,
                        "prompts": n,
                        **growth_summary(tracker.points),
                        **measure_cache(by_name[method].decoder.cache, eng.target.backend.vocab_size),
                    }
                )
        st.full_cache_entries = len(by_name["spd-dm+ngram"].decoder.cache)

    def lookup_jobs(self, eng: Engine, st: _Stream, jobs: list, kinds: dict) -> list:
        """A METHOD+lookup twin of each row in LOOKUP_BASES that runs: its drafter, its K and a copy of
        the cache it starts from, with the context lookup on and the answer memory its pass left (the
        train prompts' answers; its pass is reported once, on its base), which keeps learning online."""
        if self.s.lookup is None:
            return []
        out, by_name = [], {j.name: j for j in jobs}
        for method in LOOKUP_BASES:
            if method not in by_name:
                continue
            path = st.pp_cache if method == "spd-dm+ngram_pp" else self.adapted.get((st.name, method), {}).get("cache")
            cache = eng.load_cache(Path(path)) if path else eng.new_cache()
            memory = self.pass_memory(eng, st, method)
            name = method + LOOKUP
            k = st.ks.get(method, st.draft_len)
            drafter = by_name[method].decoder.drafter
            out.append(
                eng.job(
                    name,
                    st.prompts,
                    "ngram",
                    k,
                    self.s.max_new_tokens,
                    cache=cache,
                    drafter=drafter,
                    lookup=self.s.lookup,
                    memory=memory,
                )
            )
            st.ks[name] = k
            kinds[name] = kinds.get(method)
        return out

    def pass_memory(self, eng: Engine, st: _Stream, method: str) -> AnswerMemory:
        """A copy of the answer memory METHOD's pass over the train prompts left (empty without one)."""
        path = st.pp_memory if method == "spd-dm+ngram_pp" else self.adapted.get((st.name, method), {}).get("memory")
        return eng.load_memory(Path(path)) if path else eng.new_memory()

    def eviction(self, eng: Engine, st: _Stream) -> None:
        self.report["cache"]["eviction"] += eviction_rows(
            eng,
            stream=st.name,
            prompts=st.prompts,
            full=st.full_cache_entries,
            draft_len=st.draft_len,
            max_new_tokens=self.s.max_new_tokens,
            progress=self.progress,
        )

    def peers(self, st: _Stream) -> None:
        from omnidraft.bench import peer_section

        peer_section.run_peers(self, st)


def run_bench(s: BenchSettings, progress: bool = True) -> dict:
    """Run every section; always writes DIR/bench.json, bench.md and the plots, also on Ctrl-C."""
    validate(s)
    pair = resolve_pair(s.pair)  # a bad pair fails here, before anything is written
    check_writable(s.out, folder=True)  # so does an --out the report could not be written to
    report = new_report(s)
    report["meta"]["threads"] = set_threads(s.threads)
    bench = Bench(s, report, progress)
    bench.pair = pair
    try:
        bench.run()
    except KeyboardInterrupt:
        report["interrupted"] = True
    finally:
        finish(report, s.out)
    return report


def finish(report: dict, out: Path) -> None:
    from omnidraft.bench import plots
    from omnidraft.bench.claims import must_show, ordering
    from omnidraft.bench.report import markdown, pass_curve

    report["checks"] = {"ordering": ordering(report), "must_show": must_show(report)}
    out.mkdir(parents=True, exist_ok=True)
    title = f"omnidraft bench ({report['meta']['settings']['backend']})"
    made = []
    for fname, fn, arg, what in (
        ("speedup.png", plots.plot_speedup, report["rows"], ""),
        (
            "acceptance.png",
            plots.plot_acceptance,
            {
                f"{r['stream']}: {r['method']}": r["running_acceptance"]
                for r in report["rows"]
                if r.get("status") == "ok" and r["method"] != "target-only"
            },
            ": held-out prompts",
        ),
        (
            "adaptation.png",
            plots.plot_acceptance,
            {
                f"{r['stream']}: {r['method']}": pass_curve(r["adaptation"]["per_prompt"])
                for r in report["rows"]
                if "per_prompt" in (r.get("adaptation") or {})
            },
            ": train prompts, while adapting",
        ),
        ("cache_growth.png", plots.plot_growth, report["cache"]["growth"], ""),
        ("peers.png", plots.plot_peers, report["peers"], ""),
        ("verify_cost.png", plots.plot_verify_cost, report["verify_cost"], ""),
    ):
        if fn(arg, out / fname, title + what):
            made.append(fname)
    report["plots"] = made
    write_json(out / "bench.json", report)
    md = markdown(report)
    if report["meta"]["settings"]["backend"] in DRAFTER_DEVICES:  # no speed claim from a simulated NPU
        md = (
            "> The drafter ran on the QNN HTP simulator (x86): its timings and every speedup below are not "
            "device timings.\n\n" + md
        )
    write_text(out / "bench.md", md)
