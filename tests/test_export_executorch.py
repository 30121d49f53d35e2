"""ExecuTorch export: fp32 and both torchao quants (+ 8-bit embeddings) pass their parity gate.

Lowering to XNNPACK takes tens of seconds even for a one-layer model on two cores, so this file
exports three artifacts only (ExecuTorch's LLM path, chosen automatically): Llama fp32, Llama
8da4w, Qwen2 8da8w with an int8 embedding table. test_backends_executorch covers the static path.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import make_tiny_model

from omnidraft.errors import InvalidArgument, ManifestError, ModelFolderError
from omnidraft.export.pipeline import export_model
from omnidraft.export.quantize import torchao_quantize
from omnidraft.runtime.manifest import load_manifest

GPT2 = Path(__file__).resolve().parents[1] / "models" / "tokenizers" / "gpt2"
CASES = [("llama", "fp32", "none"), ("llama", "8da4w", "none"), ("qwen2", "8da8w", "int8")]


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[tuple[str, str, str], Path]:
    root = tmp_path_factory.mktemp("et")
    hf = {a: make_tiny_model(root / f"hf-{a}", a, GPT2, seed=5, layers=1, max_pos=128) for a in ("llama", "qwen2")}
    return {
        (a, q, e): export_model(
            hf[a], "executorch", q, 32, root / f"{a}-{q}-{e}", embedding_quant=e, progress=False
        ).out_dir
        for a, q, e in CASES
    }


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_exports_and_passes_gate(exports, case):
    m = load_manifest(exports[case])
    assert (m.format, m.quant, m.embedding_quant) == ("executorch", case[1], case[2])
    assert m.inputs == ["tokens", "input_pos"] and m.outputs == ["logits"]
    assert m.exporter.startswith("executorch-llm")
    assert m.artifact_file == "model.pte" and m.max_seq_len == 32 and m.skipped_layers == []
    p = m.parity
    assert p["positions"] == 20 + 1 + 4 + 1 + 3
    if case[1] == "fp32":
        assert p["reference"] == "fp32-eager" and p["max_abs_diff"] <= 1e-4
    else:
        assert p["reference"] == "quantized-eager" and p["top1_agreement"] >= 0.9
        assert "top1_vs_fp32_eager" in p


def test_quantized_artifacts_are_smaller(exports):
    # The 50k x 32 GPT-2 embedding dominates these tiny models: 8da4w leaves it fp32 (so ~half the
    # fp32 size, which stores it twice, tied), the 8-bit embedding table cuts it 4x.
    sizes = {c: load_manifest(d).artifact_bytes for c, d in exports.items()}
    assert sizes["llama", "8da4w", "none"] < 0.6 * sizes["llama", "fp32", "none"]
    assert sizes["qwen2", "8da8w", "int8"] < sizes["llama", "fp32", "none"] / 3


def test_truncated_pte_is_refused(exports, tmp_path):
    d = tmp_path / "e"
    shutil.copytree(exports["llama", "fp32", "none"], d)
    pte = d / "model.pte"
    pte.write_bytes(pte.read_bytes()[:4096])
    with pytest.raises(ManifestError, match="re-export with `omnidraft export"):
        load_manifest(d)
    from omnidraft.runtime.backends.executorch import ExecuTorchBackend

    with pytest.raises(ModelFolderError, match="ExecuTorch cannot load"):
        ExecuTorchBackend(d, load_manifest(d, verify=False))


def test_group_size_misfit_layers_are_skipped_and_named():
    from transformers import LlamaConfig, LlamaForCausalLM

    # hidden 48: q/k/v/o/gate/up have in_features 48 (no 32-group fits), down_proj has 96 = 3 x 32
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).eval()
    skipped = torchao_quantize(model, "8da4w")
    assert "model.layers.0.mlp.down_proj" not in skipped
    assert {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj", "lm_head"} <= set(skipped)
    assert type(model.model.layers[0].mlp.down_proj.weight) is not torch.nn.Parameter  # quantized
    assert type(model.model.layers[0].mlp.up_proj.weight) is torch.nn.Parameter
    with torch.no_grad():
        assert np.isfinite(model(torch.tensor([[1, 2, 3]])).logits.numpy()).all()


def test_llm_path_refuses_models_it_cannot_express(tmp_path):
    import json

    from omnidraft.export.executorch_llm import unsupported_reason
    from omnidraft.export.hf_model import inspect_folder

    hf = make_tiny_model(tmp_path / "hf", "llama", GPT2, seed=5, layers=1, max_pos=128)
    assert unsupported_reason(inspect_folder(hf)) is None
    cfg = json.loads((hf / "config.json").read_text())
    cfg["rope_parameters"] = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    (hf / "config.json").write_text(json.dumps(cfg))
    assert "rope type 'llama3'" in unsupported_reason(inspect_folder(hf))
    with pytest.raises(InvalidArgument, match="--et-path static"):
        export_model(hf, "executorch", "fp32", 32, tmp_path / "o", et_path="llm", progress=False)
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    cfg["attention_bias"] = True
    (hf / "config.json").write_text(json.dumps(cfg))
    assert "biases" in unsupported_reason(inspect_folder(hf))
    with pytest.raises(InvalidArgument, match="unknown ExecuTorch path"):
        export_model(hf, "executorch", "fp32", 32, tmp_path / "o", et_path="fast", progress=False)


def test_embedding_quant_needs_executorch(tmp_path):
    with pytest.raises(InvalidArgument, match="--format executorch only"):
        export_model(tmp_path, "onnx", "int8", 32, tmp_path / "o", embedding_quant="int8", progress=False)
