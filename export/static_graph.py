"""The static-shape decoder graph an NPU compiler takes: fixed context, fixed call width, KV outside.

``StaticStep`` runs a transformers Llama / Qwen2 model's own modules (embedding, norms, projections,
MLPs, head) around an attention written for fixed shapes: keys and values are the caller's
``[1, H, C, D]`` buffers concatenated with the call's ``w`` new rows, hidden rows are cut by an
additive ``attention_bias`` input, and rope reads a precomputed cos/sin table at ``position_ids``.
No op depends on a length known only at run time, so the graph has no dynamic dimension, no
scatter and no data-dependent shape (the runtime writes the new rows: runtime/backends/static_kv.py).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from omnidraft.errors import ExportError, InvalidArgument
from omnidraft.runtime.backends.static_kv import io_names

from .draft_vocab import small_logits
from .hf_model import ModelInfo

# QNN's HTP backend takes opsets up to 21 from ONNX Runtime 1.31's QNN EP; the TorchScript exporter
# writes up to 20 (export/onnx_export.py).
OPSET = 17
EXPORTER = "static-shape graph (torch.onnx TorchScript, opset 17)"
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # rope types whose table does not depend on length


def unsupported_reason(info: ModelInfo) -> str | None:
    """Why this model cannot become a static graph (None when it can)."""
    cfg = json.loads((info.folder / "config.json").read_text())
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in STATIC_ROPE:
        return f"rope type {kind!r} rescales with the sequence length"
    if cfg.get("use_sliding_window") or any(t != "full_attention" for t in cfg.get("layer_types") or ()):
        return "sliding-window attention layers"
    return None


class StaticStep(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, *, context_len: int) -> None:
        super().__init__()
        self.model, self.context_len = model, context_len
        inner, cfg = model.model, model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        with torch.no_grad():
            cos, sin = inner.rotary_emb(torch.zeros(1), torch.arange(context_len)[None])
        self.register_buffer("cos", cos[0], persistent=False)  # [C, D]
        self.register_buffer("sin", sin[0], persistent=False)
        # Query head h reads key/value head h // groups (grouped-query attention).
        groups = self.heads // self.kv_heads
        self.register_buffer("kv_index", torch.arange(self.heads) // groups, persistent=False)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_bias: torch.Tensor, *past):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        inner = self.model.model
        w = input_ids.shape[1]
        h = inner.embed_tokens(input_ids)
        cos = torch.nn.functional.embedding(position_ids, self.cos)  # [1, w, D]
        sin = torch.nn.functional.embedding(position_ids, self.sin)
        new = []
        for i, layer in enumerate(inner.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, w, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, w, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, w, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys = torch.cat([past[2 * i], k], dim=2)
            values = torch.cat([past[2 * i + 1], v], dim=2)
            if self.kv_heads != self.heads:
                keys, values = keys.index_select(1, self.kv_index), values.index_select(1, self.kv_index)
            scores = torch.matmul(q, keys.transpose(2, 3)) * attn.scaling + attention_bias
            out = torch.matmul(torch.softmax(scores, dim=-1), values)
            h = h + attn.o_proj(out.transpose(1, 2).reshape(1, w, self.heads * self.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            new += [k, v]
        return (self.model.lm_head(inner.norm(h)), *new)


def sample_inputs(info: ModelInfo, *, context_len: int, width: int) -> tuple:
    """Inputs of one call of ``width`` tokens (the shapes the graph is traced at)."""
    kv = (1, info.num_kv_heads, context_len, info.head_dim)
    return (
        torch.zeros(1, width, dtype=torch.int32),
        torch.arange(width, dtype=torch.int32)[None],
        torch.zeros(1, 1, width, context_len + width),
        *[torch.zeros(kv) for _ in range(2 * info.num_layers)],
    )


def export_static(model: torch.nn.Module, info: ModelInfo, *, context_len: int, width: int, path: Path) -> None:
    """Write the fp32 graph of one call width to ``path``."""
    if reason := unsupported_reason(info):
        raise InvalidArgument(f"the static NPU graph cannot take this model ({reason}); export it for the CPU")
    if width > context_len:
        raise InvalidArgument(f"call width {width} exceeds the context of {context_len} positions")
    inputs, outputs = io_names(info.num_layers)
    sample = sample_inputs(info, context_len=context_len, width=width)
    step = StaticStep(model, context_len=context_len).eval()
    try:
        with warnings.catch_warnings(), torch.no_grad(), small_logits(model):
            warnings.simplefilter("ignore")  # tracer chatter about constant shapes is the point here
            torch.onnx.export(
                step, sample, str(path), input_names=inputs, output_names=outputs, opset_version=OPSET, dynamo=False
            )
    except Exception as exc:  # tracer / symbolic errors come in many types
        raise ExportError(
            f"static graph export of {info.architecture} failed: {str(exc).splitlines()[0][:300]}"
        ) from exc
