"""One row of the bench's method and projection tables: what a stream run measured, set against
target-only, the speedup bound and the paper's figures."""

from __future__ import annotations

from omnidraft.bench.metrics import (
    PAPER_LATENCY_S,
    PROJECTION_TARGETS,
    ideal_speedup,
    paper_reference,
    projected_speedup,
    speedup_bound,
)
from omnidraft.bench.streams_eval import StreamRun


def method_row(stream: str, method: str, backend: str, run: StreamRun, base: StreamRun, cache: str | None) -> dict:
    r = run.row()
    st, bs = run.stats, base.stats
    target_step = bs.target_seconds / bs.steps if bs.steps else None
    r.update(
        stream=stream,
        method=method,
        backend=backend,
        status="ok",
        cache=cache,
        running_acceptance=[round(a, 4) for a in run.running_acceptance],
        outputs_match_target_only=run.outputs == base.outputs,
        target_ms_per_step=round(1e3 * target_step, 4) if target_step else None,
        speedup=round(run.tokens_per_s / base.tokens_per_s, 4) if base.tokens_per_s else None,
        decode_speedup=round(run.decode_tokens_per_s / base.decode_tokens_per_s, 4)
        if base.decode_tokens_per_s
        else None,
    )
    if method == "target-only":
        r.update(
            draft_len=None,
            acceptance_rate=None,
            ngram_hits_per_step=None,
            split_tokens_per_step=None,
            cost_ratio=None,
            running_acceptance=[],
            drafter_ms_per_call=None,
            bound=1.0,
            bound_ratio=r["speedup"],
            ideal=1.0,
            ideal_ratio=r["speedup"],
        )
        return r
    drafter_call = st.drafter_seconds / st.drafter_calls if st.drafter_calls else 0.0
    c = drafter_call / target_step if target_step else 0.0
    calls = st.drafter_calls / st.steps if st.steps else 0.0
    # adaptive rows (draft_len "auto"): the bound at their mean draft length
    bound = speedup_bound(st.acceptance_rate, run.draft_len if isinstance(run.draft_len, int) else calls, c)
    ideal = ideal_speedup(st.tokens_per_step, calls, c)
    r.update(
        drafter_ms_per_call=round(1e3 * drafter_call, 4),
        cost_ratio=round(c, 4),
        drafter_calls_per_step=round(calls, 4),
        verify_ms_per_step=round(1e3 * st.target_seconds / st.steps, 4) if st.steps else None,
        bound=round(bound, 4),
        bound_ratio=round(r["speedup"] / bound, 4) if r["speedup"] and bound else None,
        ideal=round(ideal, 4),
        ideal_ratio=round(r["speedup"] / ideal, 4) if r["speedup"] and ideal else None,
    )
    if not st.proposed:  # hybrid+adaptive with drafting turned off throughout: no draft was judged
        r.update(acceptance_rate=None, drafter_ms_per_call=None, cost_ratio=None)
    return r


def unavailable(stream: str, method: str, backend: str, reason: str) -> dict:
    return {"stream": stream, "method": method, "backend": backend, "status": reason}


def projected(row: dict) -> dict:
    out = {
        "stream": row["stream"],
        "method": row["method"],
        "label": "projected",
        "tokens_per_step": row["tokens_per_step"],
        "drafter_calls_per_step": row["drafter_calls_per_step"],
        "acceptance_rate": row["acceptance_rate"],
    }
    for tgt in PROJECTION_TARGETS:
        out[f"projected_speedup_{tgt}"] = round(
            projected_speedup(row["tokens_per_step"], row["drafter_calls_per_step"], PAPER_LATENCY_S[tgt]), 4
        )
        ref = paper_reference(row["method"], row["stream"], tgt)
        out[f"paper_acceptance_{tgt}"], out[f"paper_speedup_{tgt}"] = ref if ref else (None, None)
    return out
