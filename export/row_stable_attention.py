"""Attention that computes a query row the same bits whether it arrives alone or in a k-token call.

Greedy speculative output equals target-only output only if verifying k tokens in one call gives
each row exactly what k one-token decode steps give. ONNX Runtime's CPU MatMul (MLAS) sends a
one-row product through its GEMV kernel and a k-row product through the tiled GEMM kernel; on
AVX-512 CPUs the two round differently (a few 1e-6 in the attention output). In fp32 that stays a
few 1e-6 in the logits, but int8-compute MatMulNBits (accuracy level 4) rounds every activation to
an 8-bit grid, so now and then a 1e-6 difference crosses a grid step and the logits move by ~0.03:
enough to flip a near-tied greedy choice (measured on the bundled target, Intel Xeon with
AVX-512 VNNI, onnxruntime 1.31; on the AVX2 machines of earlier sessions int8 rows agreed to 2e-6).

The fix keeps every attention product off the one-row path: one extra query row (a copy of the
last) goes in with the real ones and is dropped from the output. With it, verify rows of the
bundled target's int8 ONNX graph, and of its 8da4w ExecuTorch static-cache program, are
bit-identical to decode steps (tests/test_batch_invariance.py; the export gate measures it on every
model). The cost is one query row per attention product; the projections are untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

NAME = "omnidraft_row_stable"


def _attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len, kv_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        # The padded call has two or more rows, so sdpa would turn causal for a decode step: state
        # the mask instead (bottom-right aligned: row i sees keys up to kv_len - q_len + i).
        rows = torch.arange(q_len, device=query.device).unsqueeze(1) + (kv_len - q_len)
        attention_mask = (torch.arange(kv_len, device=query.device).unsqueeze(0) <= rows)[None, None]
    mask = attention_mask.expand(attention_mask.shape[0], attention_mask.shape[1], q_len, kv_len)
    padded_q = torch.cat([query, query[:, :, -1:]], dim=2)
    padded_mask = torch.cat([mask, mask[:, :, -1:]], dim=2)
    kwargs["is_causal"] = False
    out, weights = sdpa_attention_forward(module, padded_q, key, value, padded_mask, **kwargs)
    return out[:, :q_len], weights  # [batch, q_len + 1, heads, head_dim] -> drop the padding row


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def row_stable_attention(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, ``model`` (a transformers decoder) attends with the row-stable function."""
    _register()
    saved = model.config._attn_implementation
    model.config._attn_implementation = NAME
    try:
        yield
    finally:
        model.config._attn_implementation = saved
