"""The verify cost curve: milliseconds of one target call that verifies k tokens (k = 1..16) at a
fixed context, per backend, beside one drafter step.

Speculative decoding pays one such call per round, so a draft of K tokens is worth its cost only
while the curve stays flat: a 0.5B target on a CPU verifies 8 tokens for well under twice a decode
step, where a tiny target's curve climbs from the first extra token. The curve is measured on the
loaded engines themselves (same threads, same padding of one-token calls) after the timed rows.
"""

from __future__ import annotations

from omnidraft.bench.export_timing import time_steps

KS = tuple(range(1, 17))
CONTEXT = 64  # tokens in the cache before the call: a short prompt, as the streams' prompts are


def measure(eng, *, repeats: int, context: int = CONTEXT) -> dict:
    """One backend's curve: median and minimum ms per k, each k's ratio to the one-token call, and
    the drafter's one-token step (the other half of the cost ratio)."""
    target = eng.target.backend
    ctx = max(1, min(context, target.max_seq_len - max(KS) - 1, eng.drafter.backend.max_seq_len - 2))
    med, low = time_steps(target, ctx, repeats, KS)
    drafter, _ = time_steps(eng.drafter.backend, ctx, repeats, (1,))
    target.reset()
    eng.drafter.backend.reset()
    return {
        "backend": eng.backend,
        "context": ctx,
        "repeats": repeats,
        "target_ms": {k: round(v, 4) for k, v in med.items()},
        "target_ms_min": {k: round(v, 4) for k, v in low.items()},
        "ratio_to_one_token": {k: round(v / med["1"], 4) for k, v in med.items()},
        "drafter_step_ms": round(drafter["1"], 4),
        "drafter_cost_ratio": round(drafter["1"] / med["1"], 4),
    }


def markdown(curves: list[dict]) -> str:
    """One row per backend: ms of a k-token target call, then the drafter's step and c = drafter ÷ target."""
    if not curves:
        return "(not measured)"
    head = "| backend | context | " + " | ".join(f"k={k}" for k in KS) + " | drafter step ms | c |"
    lines = [head, "|" + "---|" * (len(KS) + 4)]
    for c in curves:
        ms = c["target_ms"]
        lines.append(
            f"| {c['backend']} | {c['context']} | "
            + " | ".join(f"{ms[str(k)]:.2f}" for k in KS)
            + f" | {c['drafter_step_ms']:.3f} | {c['drafter_cost_ratio']:.3f} |"
        )
        ratio = c["ratio_to_one_token"]
        lines.append("| ÷ k=1 | | " + " | ".join(f"{ratio[str(k)]:.2f}" for k in KS) + " | | |")
    return "\n".join(lines)
