"""Parity gate: run an exported artifact through its runtime backend and compare with eager PyTorch.

Schedule (what the speculative loop does to a target): prefill n tokens, decode 1, verify 4 at
once, roll back to keep 1 of the 4, decode a different token there, verify 3 more. The eager
reference is a cache-free full-sequence forward of the same token sequence, so any stale KV row,
off-by-one position or wrong mask after the rollback shows up as a difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from omnidraft.errors import ExportError, ModelFolderError
from omnidraft.runtime.draft_length.head_model import forward_with_head

from .recipes import FP32_MAX_ABS_DIFF, MIN_MAX_SEQ_LEN

# Natural text so that a trained model's predictions are confident (random ids would make every
# model look uncertain and top-1 agreement meaningless).
PARITY_TEXT = (
    "The quick brown fox jumps over the lazy dog. Speculative decoding lets a small draft model "
    "propose several tokens that a larger target model verifies in a single forward pass.\n"
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n"
    "Once upon a time there was a little town by the sea, where the fishermen told stories "
    "about the weather, the tides and the price of bread. Question: what is 12 plus 30? Answer: 42."
)


@dataclass(frozen=True)
class Schedule:
    prefill: int
    tokens_a: list[int]  # sequence before the rollback
    tokens_b: list[int]  # sequence after it: tokens_a[:prefill+2] + [alt] + 3 more

    @property
    def length(self) -> int:
        return len(self.tokens_b)


def parity_tokens(tokenizer_file: Path, vocab_size: int, max_seq_len: int) -> Schedule:
    from tokenizers import Tokenizer

    try:
        ids = Tokenizer.from_file(str(tokenizer_file)).encode(PARITY_TEXT, add_special_tokens=False).ids
    except Exception as exc:  # tokenizers raises plain Exception for malformed files
        raise ModelFolderError(f"cannot read {tokenizer_file} ({exc}); save the model's fast tokenizer there") from exc
    if not ids:
        raise ModelFolderError(f"{tokenizer_file} encodes text to no tokens; it is not a usable tokenizer")
    if max(ids) >= vocab_size:
        raise ModelFolderError(
            f"{tokenizer_file} produces id {max(ids)} but the model has only {vocab_size} "
            "logits; the tokenizer does not belong to this model"
        )
    n = min(32, max_seq_len - 12)
    need = n + 8
    ids = (ids * (need // len(ids) + 1))[:need]
    a = ids[: n + 5]
    alt = (ids[n + 2] + 1) % vocab_size
    b = ids[: n + 2] + [alt] + ids[n + 5 : n + 8]
    return Schedule(prefill=n, tokens_a=a, tokens_b=b)


def hf_logits(model: torch.nn.Module):
    """ids -> logits of a cache-free full-sequence forward of a transformers model."""

    @torch.no_grad()
    def run(ids: list[int]) -> np.ndarray:
        return model(input_ids=torch.tensor([ids])).logits[0].float().numpy()

    return run


def reference_logits(run, sched: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """Reference logits of both schedule sequences from ``run(ids) -> [len, V]``."""
    return run(sched.tokens_a), run(sched.tokens_b)


def run_artifact(backend, sched: Schedule, call=None) -> dict[str, tuple[np.ndarray, slice, str]]:
    """step -> (artifact logits, rows of the reference they match, which reference 'a'|'b').
    ``call(ids, pos)`` replaces ``backend.forward`` (e.g. to read the acceptance head's output)."""
    n, a, b = sched.prefill, sched.tokens_a, sched.tokens_b
    fwd = call or backend.forward
    backend.reset()
    steps = {
        "prefill": (fwd(a[:n], 0), slice(0, n), "a"),
        "decode": (fwd(a[n : n + 1], n), slice(n, n + 1), "a"),
        "verify": (fwd(a[n + 1 : n + 5], n + 1), slice(n + 1, n + 5), "a"),
    }
    backend.rollback(n + 2)
    steps["rollback_decode"] = (fwd(b[n + 2 : n + 3], n + 2), slice(n + 2, n + 3), "b")
    steps["rollback_verify"] = (fwd(b[n + 3 : n + 6], n + 3), slice(n + 3, n + 6), "b")
    backend.reset()
    return steps


def compare(steps: dict, ref_a: np.ndarray, ref_b: np.ndarray) -> dict:
    """Per-step and overall max |diff| and greedy top-1 agreement."""
    out: dict = {"steps": {}}
    worst, hits, total = 0.0, 0, 0
    for name, (got, rows, which) in steps.items():
        ref = (ref_a if which == "a" else ref_b)[rows]
        if got.shape != ref.shape:
            raise ExportError(f"parity: {name} returned logits of shape {got.shape}, expected {ref.shape}")
        diff = float(np.abs(got - ref).max())
        agree = int((got.argmax(-1) == ref.argmax(-1)).sum())
        out["steps"][name] = {"max_abs_diff": diff, "top1_agree": agree, "positions": len(ref)}
        worst, hits, total = max(worst, diff), hits + agree, total + len(ref)
    out.update(max_abs_diff=worst, top1_agreement=hits / total, positions=total, logit_scale=float(np.abs(ref_a).max()))
    return out


def check_fp32(fig: dict, what: str) -> None:
    if not np.isfinite(fig["max_abs_diff"]) or fig["max_abs_diff"] > FP32_MAX_ABS_DIFF:
        worst = max(fig["steps"], key=lambda s: fig["steps"][s]["max_abs_diff"])
        raise ExportError(
            f"parity gate failed: {what} differs from eager PyTorch by {fig['max_abs_diff']:.3g} "
            f"(limit {FP32_MAX_ABS_DIFF:g}, worst step: {worst}); the lowering is wrong — "
            "do not use this artifact, report the model config"
        )


def check_top1(fig: dict, what: str, threshold: float) -> None:
    if not np.isfinite(fig["max_abs_diff"]) or fig["top1_agreement"] < threshold:
        raise ExportError(
            f"parity gate failed: {what} agrees with its eager reference on "
            f"{fig['top1_agreement']:.1%} of greedy top-1 tokens (needs {threshold:.0%}); the "
            "quantized artifact is broken or the model is near-untrained (then lower the bar "
            "with --min-top1, or use --quant fp32)"
        )


def check_schedule_fits(max_seq_len: int) -> None:
    if max_seq_len < MIN_MAX_SEQ_LEN:
        from omnidraft.errors import InvalidArgument

        raise InvalidArgument(f"--max-seq-len {max_seq_len} is too small; use at least {MIN_MAX_SEQ_LEN}")


@dataclass
class Built:
    """What a format's build step hands back to the pipeline."""

    inputs: list[str]
    outputs: list[str]
    parity: dict
    exporter: str
    skipped_layers: list[str] = field(default_factory=list)
    pad_single_row: bool = False  # the runtime feeds one-token calls twice (export/onnx_genai.py)
    row_splits: list[int] = field(default_factory=list)  # where the runtime cuts calls (find_row_splits)
    device_info: dict = field(default_factory=dict)  # an accelerator artifact's target (runtime/manifest.py)
    extra_files: dict = field(default_factory=dict)  # name -> sha256 of files beside the artifact


def provisional_manifest(
    fmt: str,
    quant: str,
    info,
    max_seq_len: int,
    artifact: Path,
    inputs: list[str],
    outputs: list[str],
    draft_vocab: dict | None = None,
):
    """In-memory manifest so the gate runs the artifact through the real runtime backend."""
    from omnidraft.runtime.manifest import Manifest

    return Manifest(
        format=fmt,
        quant=quant,
        architecture=info.architecture,
        vocab_size=info.vocab_size,
        max_seq_len=max_seq_len,
        num_layers=info.num_layers,
        num_kv_heads=info.num_kv_heads,
        head_dim=info.head_dim,
        inputs=inputs,
        outputs=outputs,
        artifact_file=artifact.name,
        artifact_sha256="",
        artifact_bytes=1,
        tokenizer_file="tokenizer.json",
        tokenizer_sha256="",
        source_model_sha256="",
        exporter_versions={},
        eos_token_ids=[],
        bos_token_id=None,
        parity={},
        export_command="omnidraft export ...",
        draft_vocab=draft_vocab or {},
    )


def gate(
    steps: dict,
    ref: tuple[np.ndarray, np.ndarray],
    fp32_ref: tuple[np.ndarray, np.ndarray],
    quant: str,
    what: str,
    threshold: float,
) -> dict:
    """Apply the gate for ``quant`` and return the manifest's parity figures."""
    fig = compare(steps, *ref)
    if quant == "fp32" and ref is fp32_ref:
        check_fp32(fig, what)
        return {**fig, "reference": "fp32-eager", "threshold_max_abs_diff": FP32_MAX_ABS_DIFF}
    check_top1(fig, what, threshold)
    vs_fp32 = compare(steps, *fp32_ref)
    return {
        **fig,
        "reference": "quantized-eager",
        "threshold_top1": threshold,
        "top1_vs_fp32_eager": vs_fp32["top1_agreement"],
        "max_abs_diff_vs_fp32_eager": vs_fp32["max_abs_diff"],
    }


# Batch invariance. Greedy speculative output equals target-only output only if a k-token verify
# call gives each row what k one-token decode steps give. A row-stable graph gives the same bits
# (ORT int8 with row-stable attention: 0.0 on the bundled target); fp32 kernels that take another
# path for one row differ by float rounding (~1e-5). A graph that is not row-stable behind an
# activation-rounding kernel jumps by whole rounding steps at some rows (0.03 measured on AVX-512
# VNNI before export/row_stable_attention.py), which flips near-tied greedy choices.
VERIFY_DECODE_MAX_ABS_DIFF = 1e-3
VERIFY_WINDOWS = (2, 3, 4, 5, 6, 8, 4, 3, 2, 5, 7, 4)  # verify sizes, laid end to end after the prefill


def _invariance_ids(sched: Schedule, max_seq_len: int) -> list[int]:
    text = sched.tokens_a + sched.tokens_b
    return (text * (max_seq_len // len(text) + 1))[:max_seq_len]


def _window_diff(backend, ids: list[int], pos: int, m: int) -> float:
    """Rows ``pos..pos+m`` verified in one call against as many 1-token calls from the same cache
    (the cache ends at ``pos`` + ``m``, written by the 1-token calls)."""
    together = backend.forward(ids[pos : pos + m], pos)
    backend.rollback(pos)
    alone = np.stack([backend.forward([t], pos + i)[0] for i, t in enumerate(ids[pos : pos + m])])
    return float(np.abs(together - alone).max())


def measure_batch_invariance(backend, sched: Schedule, max_seq_len: int, across: tuple[int, ...] = ()) -> dict:
    """Verify windows of several sizes at successive positions, then one window across each of
    ``across`` (the backend's row splits), each against as many 1-token calls from the same cache;
    the worst logit difference."""
    ids = _invariance_ids(sched, max_seq_len)
    pos, worst, rows = min(8, sched.prefill), 0.0, 0
    backend.reset()
    backend.forward(ids[:pos], 0)
    for m in VERIFY_WINDOWS:
        if pos + m > len(ids):
            break
        worst = max(worst, _window_diff(backend, ids, pos, m))
        pos, rows = pos + m, rows + m
    for c in across:
        start, m = max(1, c - 3), min(6, len(ids) - max(1, c - 3))
        backend.reset()
        backend.forward(ids[:start], 0)
        worst = max(worst, _window_diff(backend, ids, start, m))
        rows += m
    backend.reset()
    return {
        "verify_vs_decode_max_abs_diff": worst,
        "verify_vs_decode_rows": rows,
        "threshold_verify_vs_decode": VERIFY_DECODE_MAX_ABS_DIFF,
        "row_stable": bool(np.isfinite(worst) and worst <= VERIFY_DECODE_MAX_ABS_DIFF),
    }


# Row splits. A kernel may compute a row differently once the call's total length passes some size,
# whatever the row: onnxruntime's GEMM (MLAS) in GroupQueryAttention takes the head dimension in one
# pass while the keys number at most 64 and in two above that when heads are wider than 128 (Gemma 3,
# head_dim 256), so a verify call that ends past position 64 gives rows before it other logits than
# their decode steps did (0.3-1.4 on Gemma 3 270M int8; enough to flip greedy choices). The scan below
# finds each such size by the call lengths it separates; the runtime then cuts calls there
# (runtime/backends/ort.py). It covers the first SPLIT_SCAN positions, past every size the GEMM's
# blocking switches at for heads up to 256 wide.
SPLIT_SCAN = 160


def find_row_splits(backend, sched: Schedule, max_seq_len: int) -> list[int]:
    """Positions c such that a call holding row c - 1 and row c computes row c - 1 otherwise than
    its own decode step: for each position p, a call of 2 rows (3 where one-token calls are fed
    twice, so that the call is one token longer than the padded decode) from p against the decode
    of p."""
    width = 3 if backend.manifest.pad_single_row else 2
    ids = _invariance_ids(sched, max_seq_len)
    splits: list[int] = []
    backend.reset()
    for p in range(min(SPLIT_SCAN, max_seq_len - width)):
        together = backend.forward(ids[p : p + width], p)[0]
        backend.rollback(p)
        alone = backend.forward([ids[p]], p)[0]  # the cache keeps the decode's rows only
        if not np.abs(together - alone).max() <= VERIFY_DECODE_MAX_ABS_DIFF:
            splits.append(p + 1)
    backend.reset()
    return splits


def gate_batch_invariance(backend, sched: Schedule, max_seq_len: int, what: str, *, reopen=None) -> dict:
    """measure_batch_invariance, raising ExportError past VERIFY_DECODE_MAX_ABS_DIFF. ``reopen``
    (row splits -> a backend that cuts calls there) lets the gate find the graph's row splits first
    (find_row_splits) and measure with them; the figures then name them (``row_splits``)."""
    splits = find_row_splits(backend, sched, max_seq_len) if reopen is not None else []
    if splits:
        backend = reopen(splits)
    fig = measure_batch_invariance(backend, sched, max_seq_len, across=tuple(splits))
    if reopen is not None:
        fig["row_splits"] = splits
    if not fig["row_stable"]:
        raise ExportError(
            f"parity gate failed: {what} gives different logits for a token verified in a k-token "
            f"call than for the same token decoded alone (max |Δ| "
            f"{fig['verify_vs_decode_max_abs_diff']:.3g} over {fig['verify_vs_decode_rows']} rows, "
            f"limit {VERIFY_DECODE_MAX_ABS_DIFF:g}); speculative output would not equal target-only "
            "output — try another --quant (the bundled target's fp32 graph stays within 1e-5)"
        )
    return fig


# Acceptance head. fp32: the in-graph head computes the eager head's math, so the same
# 1e-4 logit bar applies. Quantized: the head is held to its quantize-dequantized eager reference in
# probability space, on the mean and the worst position. The reference rounds weights only, while
# int8 MatMulNBits (accuracy level 4) also rounds activations per row, so a single position can move
# further (measured on bundled-pair heads: mean 0.0008, worst 0.009 for one head and 0.11 for
# another); a wrong feature (the pre-norm hidden state, a stale KV row) moves every position.
ACCEPT_MEAN_PROB_DIFF = 0.02
ACCEPT_MAX_PROB_DIFF = 0.25


def _accept_reference(model: torch.nn.Module, head: torch.nn.Module):
    @torch.no_grad()
    def run(ids: list[int]) -> np.ndarray:
        return forward_with_head(model, head, input_ids=torch.tensor([ids]))[1][0].float().numpy()

    return run


def gate_accept(backend, sched: Schedule, model: torch.nn.Module, head: torch.nn.Module, fp32: bool, what: str) -> dict:
    """Run the parity schedule through ``forward_with_accept`` and compare the acceptance logits with
    the eager drafter + head on the full sequences; raises ExportError past the bar."""
    ref_a, ref_b = reference_logits(_accept_reference(model, head), sched)
    steps = run_artifact(backend, sched, lambda ids, pos: backend.forward_with_accept(ids, pos)[1])
    worst_logit, worst_prob, diffs, scale = 0.0, 0.0, [], 1.0

    def sig(x: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))

    for got, rows, which in steps.values():
        ref = (ref_a if which == "a" else ref_b)[rows]
        if got.shape != ref.shape:
            raise ExportError(f"parity: {what} returned accept_logits of shape {got.shape}, expected {ref.shape}")
        worst_logit = max(worst_logit, float(np.abs(got - ref).max()))
        scale = max(scale, float(np.abs(ref).max()))
        diffs.append(np.abs(sig(got) - sig(ref)).ravel())
        worst_prob = max(worst_prob, float(diffs[-1].max()))
    mean_prob = float(np.concatenate(diffs).mean()) if diffs else 0.0
    fig = {
        "max_abs_diff": worst_logit,
        "max_prob_diff": worst_prob,
        "mean_prob_diff": mean_prob,
        "reference": "fp32-eager" if fp32 else "quantized-eager",
    }
    # fp32: float32 rounding grows with the logit's size (a confident head reaches |logit| > 10), so
    # the bar scales with the largest reference logit; a wrong feature misses by whole units.
    fp32_bar = FP32_MAX_ABS_DIFF * scale
    bad = not np.isfinite(worst_logit) or (
        worst_logit > fp32_bar if fp32 else worst_prob > ACCEPT_MAX_PROB_DIFF or mean_prob > ACCEPT_MEAN_PROB_DIFF
    )
    if bad:
        bar = (
            f"{fp32_bar:.3g} in logits"
            if fp32
            else f"mean {ACCEPT_MEAN_PROB_DIFF} / worst {ACCEPT_MAX_PROB_DIFF} in probability"
        )
        raise ExportError(
            f"parity gate failed: the acceptance head in {what} differs from eager by "
            f"{worst_logit:.3g} in logits / mean {mean_prob:.3g}, worst {worst_prob:.3g} in probability "
            f"(limit {bar}); "
            "the head's lowering is wrong — do not use this artifact"
        )
    return fig
