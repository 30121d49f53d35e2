"""Derived figures: the speculative-decoding speed bound and the paper-convention projection.

Both are pure functions of measured quantities (acceptance, tokens per step, per-call latencies);
the paper's own numbers are quoted only as reference columns, never mixed into our measurements.
"""

from __future__ import annotations

# Paper Table 8: wall time per step (s) on A100, used only for the "projected" columns.
PAPER_LATENCY_S = {"Llama-68M": 0.00203, "Llama3-8B": 0.02846, "Qwen2-7B": 0.02667}
PROJECTION_TARGETS = ("Llama3-8B", "Qwen2-7B")

# Our streams stand in for the paper's tasks (code: MBPP+HumanEval, math: GSM8K, text: Alpaca).
PAPER_TASK = {"code": "MBPP+HE", "math": "GSM8K", "text": "Alpaca"}

# Paper Table 1 (acceptance, speedup) per target, method and task; Table 5 (k = 3) for the cache
# without training, which Table 1 does not report.
_T1_COLS = ("GSM8K", "MBPP+HE", "Alpaca", "XSum")
_T1 = {
    ("Llama3-8B", "spd-dm"): [(0.10, 0.94), (0.09, 1.03), (0.09, 0.96), (0.11, 0.91)],
    ("Llama3-8B", "l-dm"): [(0.32, 1.58), (0.22, 1.26), (0.16, 1.25), (0.20, 1.20)],
    ("Llama3-8B", "hybrid"): [(0.42, 1.70), (0.27, 1.33), (0.20, 1.30), (0.24, 1.24)],
    ("Llama3-8B", "hybrid+lora"): [(0.37, 1.59), (0.19, 1.28), (0.17, 1.21), (0.23, 1.21)],
    ("Qwen2-7B", "spd-dm"): [(0.14, 1.04), (0.09, 0.91), (0.13, 1.01), (0.12, 0.96)],
    ("Qwen2-7B", "l-dm"): [(0.33, 1.50), (0.22, 1.29), (0.17, 1.25), (0.19, 1.16)],
    ("Qwen2-7B", "hybrid"): [(0.37, 1.61), (0.26, 1.36), (0.20, 1.30), (0.22, 1.22)],
    ("Qwen2-7B", "hybrid+lora"): [(0.31, 1.41), (0.21, 1.21), (0.18, 1.25), (0.22, 1.21)],
}
PAPER_TABLE1 = {(tgt, m, task): v for (tgt, m), vals in _T1.items() for task, v in zip(_T1_COLS, vals)}
PAPER_TABLE5_K3 = {
    ("Llama3-8B", "spd-dm", "GSM8K"): (0.16, 1.04),
    ("Llama3-8B", "spd-dm+ngram_pp", "GSM8K"): (0.20, 1.16),
    ("Llama3-8B", "l-dm", "GSM8K"): (0.40, 1.59),
    ("Llama3-8B", "hybrid", "GSM8K"): (0.46, 1.66),
}


def speedup_bound(alpha: float, k: int, c: float) -> float:
    """Expected speedup of k-token speculative decoding with i.i.d. acceptance ``alpha`` and a drafter
    that costs ``c`` target steps per call: (1 - a^(k+1)) / ((1 - a)(1 + c k)) (Leviathan et al.)."""
    if k < 1:
        return 1.0
    if not 0.0 <= alpha <= 1.0 or c < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and c >= 0 (got alpha={alpha}, c={c})")
    expected_tokens = k + 1.0 if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    return expected_tokens / (1.0 + c * k)


def ideal_speedup(tokens_per_step: float, drafter_calls_per_step: float, c: float) -> float:
    """Speedup the measured tokens per target call would give if a verification call cost one decode
    step and the loop itself cost nothing: what acceptance allows, before implementation overheads."""
    return tokens_per_step / (1.0 + c * drafter_calls_per_step)


def projected_speedup(
    tokens_per_step: float,
    drafter_calls_per_step: float,
    target_latency_s: float,
    drafter_latency_s: float = PAPER_LATENCY_S["Llama-68M"],
) -> float:
    """Paper (Medusa) convention: acceleration rate / overhead, where the overhead is the per-step
    latency ratio (target step + drafter calls) / target step, at the paper's per-step latencies."""
    overhead = (target_latency_s + drafter_calls_per_step * drafter_latency_s) / target_latency_s
    return tokens_per_step / overhead


def paper_reference(method: str, stream: str, target: str) -> tuple[float, float] | None:
    """(acceptance, speedup) the paper reports for this method and task, if it reports one."""
    task = PAPER_TASK.get(stream)
    hit = PAPER_TABLE1.get((target, method, task))
    if hit is None:
        hit = PAPER_TABLE5_K3.get((target, method, task)) if method == "spd-dm+ngram_pp" else None
    return hit
