"""ONNX export: every quant of tiny Llama and Qwen2 passes its parity gate; bad input is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_models import make_tiny_model

from omnidraft.cli import main
from omnidraft.errors import ExportError, InvalidArgument, ManifestError, ModelFolderError
from omnidraft.export import parity, pipeline, quantize
from omnidraft.export.pipeline import export_model
from omnidraft.runtime.manifest import is_export_dir, load_manifest

GPT2 = Path(__file__).resolve().parents[1] / "models" / "tokenizers" / "gpt2"
ARCHS = ("llama", "qwen2")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {a: make_tiny_model(root / a, a, GPT2, seed=3, max_pos=256) for a in ARCHS}


@pytest.fixture(scope="module")
def exports(tiny, tmp_path_factory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("onnx")
    out = {}
    for arch in ARCHS:
        for quant in ("fp32", "int8", "int4"):
            d = root / f"{arch}-{quant}"
            export_model(tiny[arch], "onnx", quant, 64, d, progress=False)
            out[arch, quant] = d
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("quant", ["fp32", "int8", "int4"])
def test_every_quant_exports_and_passes_gate(exports, tiny, arch, quant):
    d = exports[arch, quant]
    m = load_manifest(d)
    assert is_export_dir(d) and m.format == "onnx" and m.quant == quant
    assert m.architecture == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    assert m.vocab_size == 50257 and m.max_seq_len == 64 and m.num_layers == 2
    assert m.inputs[0] == "input_ids" and m.inputs[1:3] == ["past_key_values.0.key", "past_key_values.0.value"]
    assert m.outputs[0] == "logits" and m.outputs[-1] == "present.1.value"
    assert (d / m.tokenizer_file).read_bytes() == (tiny[arch] / "tokenizer.json").read_bytes()
    assert set(m.exporter_versions) >= {"torch", "onnx", "onnxruntime", "transformers", "executorch"}
    p = m.parity
    assert set(p["steps"]) == {"prefill", "decode", "verify", "rollback_decode", "rollback_verify"}
    assert p["positions"] == 32 + 1 + 4 + 1 + 3
    if quant == "fp32":
        assert p["max_abs_diff"] <= 1e-4
    else:
        assert p["top1_agreement"] >= p["threshold_top1"] == 0.9
        assert p["fp32_graph_max_abs_diff"] <= 1e-4
        assert 0 < p["max_abs_diff"] <= p["max_abs_diff_vs_fp32_eager"]  # the reference models the quantizer
    sizes = {q: load_manifest(exports[arch, q]).artifact_bytes for q in ("fp32", "int8", "int4")}
    assert sizes["int4"] < sizes["int8"] < sizes["fp32"]


def test_ort_reference_models_the_int4_quantizer_exactly(exports):
    # MatMulNBits/GatherBlockQuantized do fp32 math on dequantized blocks: only rounding remains.
    assert load_manifest(exports["llama", "int4"]).parity["max_abs_diff"] < 1e-4


def test_sha256_mismatch_and_truncation_are_refused(exports, tmp_path):
    d = tmp_path / "e"
    shutil.copytree(exports["llama", "fp32"], d)
    art = d / "model.onnx"
    good = art.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0xFF
    art.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="re-export with `omnidraft export"):
        load_manifest(d)
    art.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(ManifestError, match="truncated, corrupted or replaced"):
        load_manifest(d)
    # Past the hash check (e.g. a manifest edited by hand), the runtime's own load error is typed too.
    from omnidraft.runtime.backends.ort import OrtBackend

    with pytest.raises(ModelFolderError, match="onnxruntime cannot load"):
        OrtBackend(d, load_manifest(d, verify=False))
    art.write_bytes(good)
    load_manifest(d)
    (d / "tokenizer.json").write_text("{}")
    with pytest.raises(ManifestError, match="tokenizer"):
        load_manifest(d, verify=True)
    (d / "manifest.json").unlink()
    assert not is_export_dir(d)
    with pytest.raises(ManifestError, match="no manifest.json"):
        load_manifest(d)


def test_manifest_missing_keys_and_bad_json(exports, tmp_path):
    d = tmp_path / "e"
    shutil.copytree(exports["qwen2", "int8"], d)
    data = json.loads((d / "manifest.json").read_text())
    del data["artifact_sha256"]
    (d / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="artifact_sha256"):
        load_manifest(d)
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(d)


def test_bad_arguments_are_refused(tiny, tmp_path):
    with pytest.raises(InvalidArgument, match="onnx, executorch"):
        export_model(tiny["llama"], "tflite", "fp32", 64, tmp_path / "x", progress=False)
    with pytest.raises(InvalidArgument, match="fp32, int8, int4"):
        export_model(tiny["llama"], "onnx", "8da4w", 64, tmp_path / "x", progress=False)
    with pytest.raises(InvalidArgument, match="max_position_embeddings"):
        export_model(tiny["llama"], "onnx", "fp32", 257, tmp_path / "x", progress=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InvalidArgument, match="cannot write to output folder"):
        export_model(tiny["llama"], "onnx", "fp32", 64, blocker / "sub", progress=False)


def test_unsupported_or_pickle_folders_are_refused(tiny, tmp_path):
    gpt = tmp_path / "gpt"
    shutil.copytree(tiny["llama"], gpt)
    cfg = json.loads((gpt / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (gpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFolderError, match="supported: LlamaForCausalLM, Qwen2ForCausalLM"):
        export_model(gpt, "onnx", "fp32", 64, tmp_path / "x", progress=False)
    pkl = tmp_path / "pkl"
    shutil.copytree(tiny["llama"], pkl)
    (pkl / "model.safetensors").rename(pkl / "pytorch_model.bin")
    with pytest.raises(ModelFolderError, match="pickle"):
        export_model(pkl, "onnx", "fp32", 64, tmp_path / "x", progress=False)


def test_failing_gate_raises_and_publishes_nothing(tiny, tmp_path, monkeypatch):
    import torch

    original = quantize.ort_reference

    def wrong_reference(model, quant):  # a reference the graph cannot match, as if the graph were garbage
        ref = original(model, quant)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(torch.randn_like(p))
        return ref

    monkeypatch.setattr(quantize, "ort_reference", wrong_reference)
    out = tmp_path / "o"
    with pytest.raises(ExportError, match="parity gate failed.*top-1"):
        export_model(tiny["llama"], "onnx", "int8", 64, out, progress=False)
    assert not is_export_dir(out) and not list(out.glob("*.onnx"))


def test_gate_checks_are_strict():
    steps = {"prefill": {"max_abs_diff": 2e-4}}
    with pytest.raises(ExportError, match="limit 0.0001"):
        parity.check_fp32({"max_abs_diff": 2e-4, "steps": steps}, "x")
    parity.check_fp32({"max_abs_diff": 5e-5, "steps": steps}, "x")
    with pytest.raises(ExportError, match="--min-top1"):
        parity.check_top1({"max_abs_diff": 1.0, "top1_agreement": 0.85}, "x", 0.9)
    with pytest.raises(ExportError):
        parity.check_top1({"max_abs_diff": float("nan"), "top1_agreement": 1.0}, "x", 0.9)


def test_cli_prints_one_line_and_exits_1(tiny, tmp_path, capsys):
    code = main(
        ["export", "--model", str(tiny["qwen2"]), "--format", "onnx", "--quant", "int3", "--out", str(tmp_path / "x")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "choose one of: fp32, int8, int4" in err[0]


def test_cli_export_summary(tiny, tmp_path, capsys):
    code = main(
        [
            "export",
            "--model",
            str(tiny["qwen2"]),
            "--format",
            "onnx",
            "--quant",
            "int4",
            "--max-seq-len",
            "48",
            "--out",
            str(tmp_path / "x"),
            "--no-progress",
        ]
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 1
    assert "onnx/int4 Qwen2ForCausalLM" in out[0] and "MiB" in out[0] and "top-1" in out[0]
    assert pipeline.ExportResult  # the summary comes from the library, the command stays thin
