"""ExecuTorch's own LLM export path (the fast one) for Llama and Qwen2.

The HF weights are loaded into ExecuTorch's reference ``Transformer`` (examples/models/llama) with
HF-style rope, the attention swapped for ExecuTorch's custom ``llama::custom_sdpa`` and
``llama::update_cache`` ops, exactly as ``export_llm`` does with ``use_kv_cache``,
``use_sdpa_with_kv_cache``, ``enable_dynamic_shape`` and ``generate_full_logits``. Those ops attend
to the filled prefix of the cache only, where the transformers static-cache graph attends to every
row of ``max_seq_len`` under a mask, so a short context costs a fraction of a full one. We build the module ourselves rather than calling ``export_llm``
because that tool reads its checkpoint with ``torch.load`` (pickle), which omnidraft never does.

Program: ``forward(tokens[1,k], input_pos[1]) -> logits[1,k,V]``; rollback is calling again at an
earlier ``input_pos``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import torch

from omnidraft.errors import ExportError

from .hf_model import ModelInfo

INPUTS = ["tokens", "input_pos"]
LLM_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
OUTPUTS = ["logits"]

_LAYER_NAMES = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.down_proj": "feed_forward.w2",
    "mlp.up_proj": "feed_forward.w3",
}
_TOP_NAMES = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
}


def unsupported_reason(info: ModelInfo) -> str | None:
    """Why this model cannot take the LLM path (None when it can)."""
    if info.architecture not in LLM_ARCHITECTURES:
        return f"the {info.architecture} architecture (the LLM path builds Llama and Qwen2)"
    cfg = json.loads((info.folder / "config.json").read_text())
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if (rope.get("rope_type") or rope.get("type") or "default") != "default":
        return f"rope type {rope.get('rope_type') or rope.get('type')!r} (only plain rope)"
    if cfg.get("hidden_act", "silu") != "silu":
        return f"activation {cfg.get('hidden_act')!r}"
    if cfg.get("mlp_bias") or (info.architecture == "LlamaForCausalLM" and cfg.get("attention_bias")):
        return "linear biases outside q/k/v"
    if cfg.get("use_sliding_window"):
        return "sliding-window attention"
    return None


def _model_args(info: ModelInfo, max_seq_len: int):
    from executorch.examples.models.llama.model_args import ModelArgs

    cfg = json.loads((info.folder / "config.json").read_text())
    rope = cfg.get("rope_parameters") or {}
    heads = int(cfg["num_attention_heads"])
    return ModelArgs(
        dim=int(cfg["hidden_size"]),
        n_layers=info.num_layers,
        n_heads=heads,
        n_kv_heads=info.num_kv_heads,
        vocab_size=info.vocab_size,
        hidden_dim=int(cfg["intermediate_size"]),
        head_dim=info.head_dim,
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        use_hf_rope=True,
        attention_qkv_bias=info.architecture == "Qwen2ForCausalLM",
        max_seq_len=max_seq_len,
        max_context_len=max_seq_len,
        max_batch_size=1,
        use_kv_cache=True,
        use_sdpa_with_kv_cache_op=True,
        generate_full_logits=True,
        enable_dynamic_shape=True,
    )


def build_transformer(hf_model: torch.nn.Module, info: ModelInfo, max_seq_len: int) -> torch.nn.Module:
    """ExecuTorch's Transformer holding the HF weights (names mapped; HF rope, so no q/k permute)."""
    from executorch.examples.models.llama.llama_transformer import construct_transformer

    model = construct_transformer(_model_args(info, max_seq_len)).eval()
    state = {}
    for name, tensor in hf_model.state_dict().items():
        if name in _TOP_NAMES:
            state[_TOP_NAMES[name]] = tensor
            continue
        parts = name.split(".")  # model.layers.{i}.{module path}.{weight|bias}
        if parts[:2] != ["model", "layers"] or ".".join(parts[3:-1]) not in _LAYER_NAMES:
            raise ExportError(f"unexpected weight {name!r} for the ExecuTorch LLM path; use --et-path static")
        state[f"layers.{parts[2]}.{_LAYER_NAMES['.'.join(parts[3:-1])]}.{parts[-1]}"] = tensor
    state.setdefault("output.weight", state["tok_embeddings.weight"])  # tied embeddings
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Caches, masks and rope tables are buffers the model builds itself.
    missing = [m for m in missing if not any(s in m for s in ("cache", "mask", "freqs"))]
    if missing or unexpected:
        raise ExportError(
            f"weight mapping to ExecuTorch's Transformer failed (missing {missing[:4]}, "
            f"unexpected {unexpected[:4]}); use --et-path static"
        )
    return model


def use_custom_ops(model: torch.nn.Module) -> torch.nn.Module:
    from executorch.examples.models.llama.source_transformation.custom_kv_cache import (
        replace_kv_cache_with_custom_kv_cache,
    )
    from executorch.examples.models.llama.source_transformation.sdpa import replace_sdpa_with_custom_op

    # Order as in export_llama: SDPA first, then the cache.
    return replace_kv_cache_with_custom_kv_cache(replace_sdpa_with_custom_op(model))


def eager_logits(model: torch.nn.Module):
    """ids -> logits of a whole sequence from position 0 (the parity gate's reference)."""

    @torch.no_grad()
    def run(ids: list[int]) -> np.ndarray:
        out = model(torch.tensor([ids]), {"input_pos": torch.tensor([0])})
        return (out[0] if isinstance(out, tuple) else out)[0].float().numpy()

    return run


def export_pte_llm(model: torch.nn.Module, max_seq_len: int, path: Path) -> None:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass
    from torch.nn.attention import SDPBackend, sdpa_kernel

    k = torch.export.Dim("k", min=1, max=max_seq_len)
    sample = (torch.zeros(1, 2, dtype=torch.long), {"input_pos": torch.tensor([0])})
    try:
        with warnings.catch_warnings(), torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
            warnings.simplefilter("ignore")
            program = torch.export.export(model, sample, dynamic_shapes=({1: k}, {"input_pos": {0: 1}}), strict=True)
            edge = to_edge_transform_and_lower(
                program,
                partitioner=[XnnpackPartitioner()],
                compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
            )
            # Settings of export_llama's to_executorch: inputs are not memory-planned (the caller
            # owns them), shapes are bounded from the export constraints.
            lowered = edge.to_executorch(
                ExecutorchBackendConfig(
                    extract_delegate_segments=True,
                    memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
                    sym_shape_eval_pass=ConstraintBasedSymShapeEvalPass(),
                )
            )
    except Exception as exc:  # torch.export / exir raise many unrelated types
        raise ExportError(
            f"ExecuTorch LLM-path lowering failed: {str(exc).splitlines()[0][:300]}; retry with --et-path static"
        ) from exc
    with open(path, "wb") as f:
        lowered.write_to_file(f)
