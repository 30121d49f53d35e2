"""Weight precision of quantized exports: 8-bit embedding tables in int8 graphs, the embedding and LM
head kept at 8 bits under a 4-bit body where the quality gate needs it, and the gate's own rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import make_tiny_model

from omnidraft.export import quality
from omnidraft.export.genai_weights import INT4_LADDER
from omnidraft.export.pipeline import export_model
from omnidraft.export.quantize import _fq_block, block_quantize_8bit

TOK = Path(__file__).resolve().parents[1] / "models" / "tokenizers"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("wp") / "t", "qwen2", TOK / "gpt2", seed=7, hidden=64, max_pos=128)


def test_8bit_codes_dequantize_to_the_reference_grid():
    w = np.random.default_rng(0).normal(size=(5, 64)).astype(np.float32)
    data, scales = block_quantize_8bit(w)
    deq = ((data.astype(np.float32) - 128).reshape(5, 2, 32) * scales[..., None]).reshape(5, 64)
    assert np.array_equal(deq, _fq_block(torch.from_numpy(w), 8).numpy())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize("symmetric", [True, False])
def test_the_rtn_grid_is_the_builders_rtn_quantizer(bits, block, symmetric):
    from onnxruntime.quantization.neural_compressor.weight_only import quant_tensor

    w = np.random.default_rng(bits).normal(size=(6, 96)).astype(np.float32)
    w[0, :32] = 0.0  # an all-zero block keeps scale 1
    w[1, 32:64] = np.abs(w[1, 32:64]) + 0.5  # all positive: the asymmetric zero point clips to 0
    # The builder's RTN pass asks for unsigned codes when asymmetric (weight_only.rtn_quantize).
    q, scale, zp = quant_tensor(w.copy(), bits, block, "sym" if symmetric else "asym", "int" if symmetric else "uint")
    want = ((q - zp.astype(np.float64)) * scale).reshape(6, 96)
    got = _fq_block(torch.from_numpy(w), bits, block, grid="rtn", symmetric=symmetric).numpy()
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(w).max())
    assert not np.allclose(got, _fq_block(torch.from_numpy(w), bits).numpy())  # the default grid differs


def test_int8_graph_carries_an_8bit_embedding_and_passes_its_gates(tiny, tmp_path):
    res = export_model(tiny, "onnx", "int8", 96, tmp_path / "e", progress=False, onnx_path="genai")
    parity = json.loads((tmp_path / "e" / "manifest.json").read_text())["parity"]
    assert parity["weights_bits"] == {"embedding": 8, "lm_head": 8}
    assert parity["top1_agreement"] >= 0.9 and parity["batch_invariance"]["verify_vs_decode_max_abs_diff"] == 0.0
    fp32_table = 50257 * 64 * 4  # the tiny model's embedding in fp32 alone
    assert res.manifest.artifact_bytes < fp32_table


def test_int4_falls_back_to_8bit_ends_where_the_quality_gate_fails(tiny, tmp_path, monkeypatch, capsys):
    calls = []

    def passes(fig, **kw):  # the all-4-bit graph "fails"; the rebuilt one passes
        calls.append(fig)
        return len(calls) > 1

    monkeypatch.setattr(quality, "passes", passes)
    export_model(tiny, "onnx", "int4", 96, tmp_path / "e", progress=False, onnx_path="genai")
    parity = json.loads((tmp_path / "e" / "manifest.json").read_text())["parity"]
    assert parity["weights_bits"] == {"embedding": 8, "lm_head": 8} and len(calls) >= 2
    assert parity["int4_scheme"] == {**INT4_LADDER[1].to_dict(), "layers_at_8_bits": []}
    assert parity["top1_agreement"] >= 0.9  # the eager reference uses the builder's RTN grid
    err = capsys.readouterr().err
    assert "rebuilding with the embedding and LM head at 8 bits" in err and "sensitive layers" not in err


def test_int4_climbs_to_llama_cpp_mixed_layers_where_8bit_ends_are_not_enough(tmp_path, monkeypatch, capsys):
    calls = []

    def passes(fig, **kw):  # only the last rung "passes"
        calls.append(fig)
        return len(calls) >= len(INT4_LADDER)

    # Eight layers: llama.cpp's rule keeps layer 0 (first eighth), 7 (last eighth) and every third, 3 and 6.
    deep = make_tiny_model(tmp_path / "deep", "qwen2", TOK / "gpt2", seed=7, hidden=64, layers=8, max_pos=128)
    monkeypatch.setattr(quality, "passes", passes)
    export_model(deep, "onnx", "int4", 96, tmp_path / "e", progress=False, onnx_path="genai")
    parity = json.loads((tmp_path / "e" / "manifest.json").read_text())["parity"]
    scheme = parity["int4_scheme"]
    assert (scheme["mixed_layers"], scheme["symmetric"], scheme["block"]) == (True, False, 16)
    wide = {int(n.split(".")[2]) for n in scheme["layers_at_8_bits"]}
    assert wide == {0, 3, 6, 7}
    assert {n.rsplit(".", 1)[1] for n in scheme["layers_at_8_bits"]} == {"q_proj", "k_proj", "v_proj", "down_proj"}
    # The eager reference mirrors every layer's width, the asymmetric grid and the finer blocks.
    assert parity["top1_agreement"] >= 0.9
    err = capsys.readouterr().err
    assert "rebuilding with the embedding, LM head and llama.cpp's sensitive layers at 8 bits" in err


def test_torchao_keeps_the_head_at_8_bits_when_asked(tiny):
    from transformers import AutoModelForCausalLM

    from omnidraft.export.quantize import torchao_quantize

    m = AutoModelForCausalLM.from_pretrained(tiny).eval()
    torchao_quantize(m, "8da4w", wide=("lm_head",))
    assert m.model.layers[0].mlp.down_proj.weight.target_dtype == torch.int4
    assert m.lm_head.weight.target_dtype == torch.int8
    plain = AutoModelForCausalLM.from_pretrained(tiny).eval()
    torchao_quantize(plain, "8da4w")
    assert plain.lm_head.weight.target_dtype == torch.int4


def test_wide_groups_take_8_bits_under_a_4_bit_body(tiny):
    from transformers import AutoModelForCausalLM

    from omnidraft.export.quantize import torchao_quantize

    m = AutoModelForCausalLM.from_pretrained(tiny).eval()
    torchao_quantize(m, "8da4w", wide=("lm_head", "mlp"))
    layer = m.model.layers[0]
    assert layer.mlp.down_proj.weight.target_dtype == layer.mlp.up_proj.weight.target_dtype == torch.int8
    assert layer.self_attn.q_proj.weight.target_dtype == torch.int4
    assert m.lm_head.weight.target_dtype == torch.int8


def test_8da4w_widens_one_layer_group_at_a_time_until_the_gate_passes(tiny, tmp_path, monkeypatch, capsys):
    widths = []

    def passes(fig, **kw):  # 4-bit "fails" until the MLP layers are at 8 bits too
        widths.append(fig)
        return len(widths) > 2

    monkeypatch.setattr(quality, "passes", passes)
    export_model(tiny, "executorch", "8da4w", 96, tmp_path / "e", progress=False, et_path="static")
    parity = json.loads((tmp_path / "e" / "manifest.json").read_text())["parity"]
    assert parity["weights_bits"] == {"lm_head": 8, "mlp": 8, "attention": 4}
    err = capsys.readouterr().err
    assert "quantizing the lm_head layers to 8 bits too" in err and "quantizing the mlp layers" in err
    assert "quantizing the attention layers" not in err


def test_the_quality_gate_applies_only_to_models_that_predict_the_text():
    seqs = [[1, 2, 3, 4, 5, 6]]
    vocab = 100

    def peaked(ids):  # predicts the next token of the sequence with high confidence
        out = np.zeros((len(ids), vocab), dtype=np.float32)
        for i, t in enumerate(ids):
            out[i, t + 1] = 20.0
        return out

    def flat(ids):
        return np.zeros((len(ids), vocab), dtype=np.float32)

    good = quality.measure(peaked, peaked, seqs)
    assert good["gated"] and good["top1_vs_fp32"] == 1.0 and quality.passes(good)
    damaged = quality.measure(flat, peaked, seqs)
    assert damaged["gated"] and not quality.passes(damaged)
    with pytest.raises(Exception, match="quality gate failed"):
        quality.check(damaged, "the test graph")
    untrained = quality.measure(flat, flat, seqs)
    assert not untrained["gated"] and quality.passes(untrained)
    assert quality.parity_bar(good, 0.9) == quality.LOWERING_TOP1 and quality.parity_bar(untrained, 0.9) == 0.9
