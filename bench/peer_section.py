"""The peers section: omnidraft on each backend vs Hugging Face transformers on the same prompts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from omnidraft.bench.peers import PROMPT_LOOKUP_TOKENS, HFPeers, PeerRun, uag_configs

if TYPE_CHECKING:
    from omnidraft.bench.bench import Bench, _Stream

OWN_BACKENDS = ("torch", "ort", "executorch")
REPLAYABLE = ("spd-dm", "spd-dm+ngram", "spd-dm+ngram_pp")


def _best_method(bench: "Bench", st: "_Stream") -> str | None:
    """The fastest measured method of this stream on the main backend that can be replayed on the
    other backends (adapted drafters only where the adaptation bridge can export them)."""
    from omnidraft.bench import adapted

    rows = [r for r in bench.report["rows"] if r["stream"] == st.name and r.get("status") == "ok"
            and r["method"] != "target-only" and (r["method"] in REPLAYABLE or adapted.replayable(r["method"]))]
    return max(rows, key=lambda r: r["tokens_per_s"])["method"] if rows else None


def _replay(bench: "Bench", st: "_Stream", backend: str, method: str):
    """(target-only run, method run) of this stream's prompts on ``backend``."""
    from omnidraft.bench import adapted

    s = bench.s
    if backend == s.backend:
        return st.base, st.runs[method]
    eng = bench.engine(backend)
    base, _ = eng.run(st.prompts, "target-only", st.draft_len, s.max_new_tokens, f"{st.name}: {backend} target-only",
                      progress=bench.progress)
    mode, cache, drafter = "ngram", eng.new_cache(), None
    if method == "spd-dm":
        mode = "dm"
    elif method == "spd-dm+ngram_pp":
        cache = eng.load_cache(st.pp_cache)
    elif method not in REPLAYABLE:
        drafter, cache = adapted.for_backend(bench, eng, st.name, method)
    run, _ = eng.run(st.prompts, mode, st.draft_len, s.max_new_tokens, f"{st.name}: {backend} {method}", cache,
                     progress=bench.progress, drafter=drafter)
    return base, run


def _peer(stream: str, name: str, run, hf_base: PeerRun | None, reference: list[list[int]] | None,
          reference_name: str | None, **extra) -> dict:
    tps = run.tokens_per_s
    n = run.prompts
    return {"stream": stream, "name": name, "tokens_per_s": round(tps, 2), "prompts": n,
            "speedup_vs_hf_target_only": round(tps / hf_base.tokens_per_s, 4) if hf_base and hf_base.tokens_per_s else None,
            "outputs_match_target_only": (run.outputs[:n] == reference[:n]) if reference is not None else None,
            "compared_with": reference_name, **extra}


def run_peers(bench: "Bench", st: "_Stream") -> None:
    """HF target-only first (every speedup is over it), then omnidraft per backend, then HF's two
    accelerated modes; each peer row is appended as soon as it is measured (Ctrl-C keeps it)."""
    s = bench.s
    peers = bench.report["peers"]
    hf_base, hf_row, ids = None, None, None
    if "hf" in s.peers:
        tgt = bench.engine(s.backend).target
        if bench.hf is None:
            bench.hf = HFPeers(bench.pair.drafter, bench.pair.target, tgt.eos_ids)
        ids = [list(tgt.codec.start_ids) + tgt.codec.encode(p) for p in st.prompts]
        hf_base = _check(bench.hf.run("hf-target-only", {}, ids, s.max_new_tokens, bench.progress))
        hf_row = _peer(st.name, "hf-target-only", hf_base, hf_base, None, None, config={})
        peers.append(hf_row)
    method = _best_method(bench, st)
    for backend in OWN_BACKENDS:
        if backend not in s.peers or method is None:
            continue
        base, run = _replay(bench, st, backend, method)
        peers.append(_peer(
            st.name, f"omnidraft-{backend}", run, hf_base, base.outputs, f"omnidraft {backend} target-only",
            method=method, draft_len=st.draft_len, own_target_only_tokens_per_s=round(base.tokens_per_s, 2),
            speedup_vs_own_target_only=round(run.tokens_per_s / base.tokens_per_s, 4) if base.tokens_per_s else None))
        if backend == "torch" and hf_row is not None:
            # Same engine, same prompt ids: HF's greedy output should equal ours token for token.
            hf_row["outputs_match_target_only"] = hf_base.outputs == base.outputs[:hf_base.prompts]
            hf_row["compared_with"] = "omnidraft torch target-only"
    if hf_base is None:
        return
    tried = [_check(bench.hf.run("hf-assisted-uag", cfg, ids, s.max_new_tokens, bench.progress))
             for cfg in uag_configs(st.draft_len, bench.hf.uag_defaults)]
    uag = max(tried, key=lambda r: r.tokens_per_s)
    peers.append(_peer(st.name, "hf-assisted-uag", uag, hf_base, hf_base.outputs, "hf-target-only", config=uag.config,
                       tried=[{"config": r.config, "tokens_per_s": round(r.tokens_per_s, 2)} for r in tried]))
    pl = _check(bench.hf.run("hf-prompt-lookup", {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}, ids,
                             s.max_new_tokens, bench.progress))
    peers.append(_peer(st.name, "hf-prompt-lookup", pl, hf_base, hf_base.outputs, "hf-target-only", config=pl.config))


def _check(run: PeerRun) -> PeerRun:
    if run.interrupted:
        raise KeyboardInterrupt
    return run
