"""Loop vectors on the bundled pair: ``runtime.speculative`` on the real drafter and target.

``models/bundled/drafter`` (2-layer Llama, Llama-2 vocabulary) and ``models/bundled/target``
(6-layer Qwen2, GPT-2 vocabulary) run in eager PyTorch, each behind ``TopNBackend``, which keeps
the ``top_n`` largest logits of every row the loop reads and sets every other entry to ``FLOOR``.
The Python loop runs *on those truncated rows*, and ``Recorder`` stores them as the floor plus the
kept entries, so the file holds exactly what the Python loop saw and the Java replay must match it
bit for bit, greedy and sampling alike.

Why the top entries are enough. The acceptance rule reads a row through four functions only:
argmax (greedy acceptance, masked argmax for drafts), softmax at temperature T (q and p), the
inverse-CDF draw and the residual norm(max(0, p - q')). Argmax needs only the top entry. For the
others, ``FLOOR`` = -1e4 lies so far below any kept logit that exp((FLOOR - max) / T) is exactly 0
in float64 for every T below 13 (the runs use at most 1.0), so p, q, q' and the residual are
exactly zero off the stored support: sampling and residuals are *defined over the stored
support*, i.e. the pair the vectors record is the bundled pair under top-``top_n`` sampling. The
Java side rebuilds the full row (floor plus entries) and runs the same float64 code over the whole
vocabulary, so nothing is approximated on either side; what the truncation changes is only how
close the recorded pair is to the untruncated one, which ``kept_mass`` reports per run (the
smallest and mean probability mass at T=1 that the kept entries held in the real rows). A greedy
decision differs from the untruncated model's only when the drafter's mask (direct map plus n-gram
sub-tokens) excludes all ``top_n`` entries of a row; then both sides pick among floor entries alike.

Rows the loop never reads are stored as all floor (no entries): the drafter's loop reads only the
last row of each call, the target's only rows at positions >= (prompt length - 1), i.e. rows that
score generated tokens. Both sides see the same all-floor rows, so this saves space without
making the replay less exact; a loop that started reading such a row would read floor on both.

Torch's CPU kernels can differ in the last bits between thread counts and builds, so these vectors
are not reproducible bit for bit on another machine; they are checked instead by replaying the
stored rows through the current Python loop (tests/test_android_pair_vectors.py) and by the weight
hashes they record.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from omnidraft.android.loop import Recorder, open_cache, record_run
from omnidraft.runtime.model_checks import weights_sha256
from omnidraft.runtime.ngram_cache import NgramCache

FLOOR = np.float32(-1e4)
TOP_N = 32
BUNDLED = Path(__file__).resolve().parents[2] / "models" / "bundled"

_MATH = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:"
)
# (name, prompt, config, cache: None (fresh) or "chain" (previous run's final cache, via its file)).
# Each chained run follows the greedy run of the same domain: the greedy run adds n-grams, the
# chained sampling run proposes merged tokens from them and the target accepts some (hits).
# Token budgets keep the file small: every round stores about 2K+1 rows of TOP_N entries.
PAIR_RUNS = [
    (
        "pair-greedy-ngram-code",
        "def fibonacci(n):",
        dict(temperature=0.0, draft_len=4, mode="ngram", max_new_tokens=24),
        None,
    ),
    (
        "pair-sample-ngram-code-chained",
        "def fibonacci(n):",
        dict(temperature=0.8, draft_len=4, mode="ngram", max_new_tokens=32, seed=7),
        "chain",
    ),
    ("pair-greedy-dm-math", _MATH, dict(temperature=0.0, draft_len=4, mode="dm", max_new_tokens=16), None),
    ("pair-sample-dm-math", _MATH, dict(temperature=1.0, draft_len=3, mode="dm", max_new_tokens=24, seed=11), None),
    (
        "pair-greedy-ngram-text",
        "The quick brown fox",
        dict(temperature=0.0, draft_len=4, mode="ngram", max_new_tokens=24),
        None,
    ),
    (
        "pair-sample-ngram-text-chained",
        "To be, or not to be, that is the question:",
        dict(temperature=1.0, draft_len=4, mode="ngram", max_new_tokens=32, seed=5),
        "chain",
    ),
    (
        "pair-greedy-target-only-text",
        "The capital of France is",
        dict(temperature=0.0, draft_len=4, mode="target-only", max_new_tokens=16),
        None,
    ),
]


class TopNBackend:
    """Backend protocol; forwards to ``inner`` and truncates the rows the loop reads to their top ``top_n``.

    ``reads_from``: the first sequence position whose row the loop reads (None: only each call's
    last row). ``kept_mass`` collects, per truncated row, the T=1 probability the kept entries held.
    """

    def __init__(self, inner, top_n: int, floor: np.float32 = FLOOR, reads_from: int | None = None) -> None:
        self.inner, self.top_n, self.floor, self.reads_from = inner, top_n, np.float32(floor), reads_from
        self.name, self.vocab_size, self.max_seq_len = inner.name, inner.vocab_size, inner.max_seq_len
        self.kept_mass: list[float] = []

    @property
    def cached_len(self) -> int:
        return self.inner.cached_len

    def _read(self, start: int, n: int) -> range:
        if self.reads_from is None:
            return range(n - 1, n)
        return range(max(0, self.reads_from - start), n)

    def forward(self, token_ids, start_pos):
        full = self.inner.forward(token_ids, start_pos)
        out = np.full(full.shape, self.floor, dtype=np.float32)
        for r in self._read(start_pos, len(full)):
            row = full[r]
            # Stable sort: ties at the boundary are resolved by index, so the kept set is well defined.
            keep = np.argsort(-row, kind="stable")[: self.top_n]
            if row[keep].min() <= self.floor:
                raise AssertionError(f"a logit at or below the floor {self.floor}; lower FLOOR")
            out[r, keep] = row[keep]
            z = row.astype(np.float64) - row.max()
            self.kept_mass.append(float(np.exp(z[keep]).sum() / np.exp(z).sum()))
        return out

    def rollback(self, length):
        self.inner.rollback(length)

    def reset(self):
        self.inner.reset()


def pair_vectors(
    drafter_dir: Path = BUNDLED / "drafter",
    target_dir: Path = BUNDLED / "target",
    top_n: int = TOP_N,
    runs=PAIR_RUNS,
    progress: bool = True,
) -> dict:
    """Record ``runs`` on the pair (HF folders, eager torch) with rows truncated to their top ``top_n``."""
    from tqdm import tqdm

    from omnidraft.runtime.loader import load_model

    drafter_m, target_m = load_model(drafter_dir), load_model(target_dir)
    dc, tc = drafter_m.codec, target_m.codec
    out_runs = []
    previous: NgramCache | None = None
    for name, prompt, cfg_kw, cache_setup in tqdm(runs, desc="pair loop vectors", unit="run", disable=not progress):
        log: list = []
        n_prompt = len(tc.start_ids) + len(tc.encode(prompt))  # the loop's ctx_p before decoding
        d_top = TopNBackend(drafter_m.backend, top_n)
        t_top = TopNBackend(target_m.backend, top_n, reads_from=n_prompt - 1)
        drafter = Recorder(d_top, "drafter", log, FLOOR, max_entries=top_n)
        target = Recorder(t_top, "target", log, FLOOR, max_entries=top_n)
        cache, cache_file = open_cache(cache_setup, previous, dc, tc, drafter.vocab_size, target.vocab_size)
        run = record_run(
            name, prompt, dict(cfg_kw), drafter, target, dc, tc, cache, cache_file, log, target_eos=target_m.eos_ids
        )
        mass = {"drafter": d_top.kept_mass, "target": t_top.kept_mass}
        run["kept_mass"] = {
            k: {"min": round(min(v), 4), "mean": round(float(np.mean(v)), 4)} for k, v in mass.items() if v
        }
        out_runs.append(run)
        previous = cache
    return {
        "drafter_tokenizer": dc.sha256,
        "target_tokenizer": tc.sha256,
        "drafter_weights_sha256": weights_sha256(drafter_dir),
        "target_weights_sha256": weights_sha256(target_dir),
        "top_n": top_n,
        "floor": float(FLOOR),
        "runs": out_runs,
    }


class ReplayBackend:
    """Backend protocol that serves one model's side of a recorded run (Python twin of the Java
    RecordedModel): calls must come in the recorded order with the recorded arguments."""

    name = "replay"

    def __init__(self, tag: str, calls: list[dict], cursor: list[int], width: int, max_seq_len: int) -> None:
        self.tag, self.calls, self.cursor = tag, calls, cursor
        self.vocab_size, self.max_seq_len = width, max_seq_len
        self._len = 0

    @property
    def cached_len(self) -> int:
        return self._len

    def _next(self, op: str) -> dict:
        at = self.cursor[0]
        if at >= len(self.calls):
            raise AssertionError(f"{self.tag}.{op} after the recorded run ended (call #{at})")
        c = self.calls[at]
        if (c["m"], c["op"]) != (self.tag, op):
            raise AssertionError(f"call #{at}: the loop made {self.tag}.{op}, the record has {c['m']}.{c['op']}")
        self.cursor[0] += 1
        return c

    def forward(self, token_ids, start_pos):
        c = self._next("forward")
        if [int(t) for t in token_ids] != c["tokens"] or start_pos != c["start"]:
            raise AssertionError(
                f"{self.tag}: forward({list(token_ids)}, {start_pos}) but the record has "
                f"forward({c['tokens']}, {c['start']})"
            )
        rows = np.full((len(c["rows"]), self.vocab_size), np.float32(c["floor"]), dtype=np.float32)
        for r, row in enumerate(c["rows"]):
            rows[r, row["i"]] = np.asarray(row["v"], dtype=np.float64).astype(np.float32)
        self._len = start_pos + len(token_ids)
        return rows

    def rollback(self, length):
        c = self._next("rollback")
        if length != c["length"]:
            raise AssertionError(f"{self.tag}: rollback({length}) but the record has rollback({c['length']})")
        self._len = length

    def reset(self):
        self._next("reset")
        self._len = 0


def replay_run(run: dict, drafter_codec, target_codec, previous: NgramCache | None = None) -> dict:
    """Run the current Python loop on the rows a run recorded; returns the run record it produces
    (equal to ``run`` minus ``kept_mass`` while runtime/ behaves as when the vectors were written)."""
    import json as _json
    import tempfile

    calls, cursor = run["calls"], [0]
    widths, msl = (run["drafter_width"], run["target_width"]), run["max_seq_len"]
    log: list = []
    drafter = Recorder(ReplayBackend("drafter", calls, cursor, widths[0], msl["drafter"]), "drafter", log, FLOOR)
    target = Recorder(ReplayBackend("target", calls, cursor, widths[1], msl["target"]), "target", log, FLOOR)
    args = (drafter_codec.sha256, target_codec.sha256, widths[0])
    if run["cache_file"] is not None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "cache.json"
            path.write_text(run["cache_file"], encoding="utf-8")
            cache = NgramCache.load(path, *args, widths[1])
    else:
        before = _json.loads(run["cache_before"])
        cache = NgramCache(*args, capacity=before["capacity"], policy=before["policy"])
    cfg = {k: v for k, v in run["config"].items()}
    out = record_run(
        run["name"],
        run["prompt"],
        cfg,
        drafter,
        target,
        drafter_codec,
        target_codec,
        cache,
        run["cache_file"],
        log,
        target_eos=run["target_eos"],
    )
    if cursor[0] != len(calls):
        raise AssertionError(f"{run['name']}: the loop made {cursor[0]} of {len(calls)} recorded calls")
    return out
