"""A drafter compiled into QNN context binaries runs on the HTP simulator beside a CPU target, and the
speculative loop's greedy output equals target-only's, token for token; what the NPU path cannot
take is refused in one line. Needs the npu extra (onnxruntime-qnn); skipped without it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import onnx
import pytest
from tiny_models import make_tiny_model

from omnidraft.cli import main
from omnidraft.errors import ExportError, InvalidArgument, ManifestError
from omnidraft.export import qnn_export
from omnidraft.export.hf_model import inspect_folder, load_model
from omnidraft.export.pipeline import export_model
from omnidraft.export.static_graph import export_static
from omnidraft.models.streams import STREAMS, load_stream
from omnidraft.runtime.backends import qnn
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.loader import load_model as open_model
from omnidraft.runtime.manifest import load_manifest
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import SpeculativeDecoder

pytest.importorskip("onnxruntime_qnn", reason="needs the npu extra: pip install 'omnidraft[npu]'")

TOK = Path(__file__).resolve().parents[1] / "models" / "tokenizers"
CONTEXT = 192  # a held-out code prompt is ~135 drafter tokens


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("npu")
    # Different vocabularies on purpose: phi-3 SentencePiece drafter, GPT-2 byte-level BPE target.
    drafter = make_tiny_model(root / "d", "llama", TOK / "phi3", seed=1, max_pos=256)
    target = make_tiny_model(root / "t", "qwen2", TOK / "gpt2", seed=2, layers=1, max_pos=256)
    return {
        "drafter": drafter,
        "npu": export_model(drafter, "onnx", None, CONTEXT, root / "d-htp", progress=False, device="qnn-htp").out_dir,
        "target": export_model(target, "onnx", "fp32", CONTEXT, root / "t-cpu", progress=False).out_dir,
    }


def test_the_manifest_names_device_chip_toolchain_widths_and_simulator_parity(pair):
    m = load_manifest(pair["npu"])
    info, p = m.device_info, m.parity
    assert m.device == "qnn-htp" and m.quant == "fp16" and m.format == "onnx"
    assert (info["soc"], info["soc_model"], info["htp_arch"]) == ("SM8650", 57, 75)
    assert info["qairt"] == "2.51.0" and info["onnxruntime_qnn"] == "2.7.0"
    assert info["call_widths"] == [1, 8] and info["context_len"] == CONTEXT
    assert info["runs_here"] == "simulator" and p["ran_on"].startswith("QNN HTP simulator")
    assert set(m.extra_files) == {"model_qnn.bin", "model_w8.onnx", "model_w8_qnn.bin"}
    for name in ("model.onnx", "model_w8.onnx"):  # the artifact holds compiled graphs only
        assert {n.op_type for n in onnx.load(str(pair["npu"] / name)).graph.node} == {"EPContext"}
    assert qnn.binary_target(pair["npu"] / "model_qnn.bin") == ("SM8650", 75)
    # fp16 on the HTP vs fp32 on the CPU: close, not equal, and the same greedy choices.
    assert 0 < p["vs_cpu_graph"]["max_abs_diff"] < 0.05 * p["logit_scale"]
    assert p["vs_cpu_graph"]["top1_agreement"] >= p["threshold_top1"]
    assert p["static_graph_vs_eager_max_abs_diff"] <= 1e-4
    assert "row_stable" in p["batch_invariance"]


def test_npu_drafter_beside_cpu_target_gives_target_only_output_on_every_stream(pair):
    tgt, drf = open_model(pair["target"]), open_model(pair["npu"])
    assert drf.backend.name == "qnn-htp" and drf.info["device"] == "qnn-htp" and tgt.info["device"] == "cpu"
    cache = NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size)
    dec, proposed = SpeculativeDecoder(tgt, drf, cache), 0
    for s in STREAMS:
        for k, prompt in enumerate(load_stream(s, "test")[:2]):
            ref = dec.generate(prompt.prompt, DecodeConfig(max_new_tokens=10, mode="target-only"))
            mode = ("ngram", "dm")[k]
            out = dec.generate(prompt.prompt, DecodeConfig(max_new_tokens=10, mode=mode, draft_len=3 + k))
            assert out.token_ids == ref.token_ids, (s, prompt.id, mode)
            proposed += out.stats.proposed
    assert proposed > 0


def test_a16w8_qdq_drafter_is_calibrated_compiled_and_gated(pair, tmp_path):
    d = export_model(
        pair["drafter"], "onnx", "a16w8", 32, tmp_path / "q", progress=False, device="qnn-htp", call_widths="1,4"
    ).out_dir
    m = load_manifest(d)
    assert m.quant == "a16w8" and m.device_info["precision"] == "a16w8" and m.device_info["call_widths"] == [1, 4]
    assert m.parity["cpu_graph"] == "a16w8 QDQ graph"
    assert m.parity["vs_cpu_graph"]["top1_agreement"] >= m.parity["threshold_top1"]
    be = open_model(d).backend
    assert be.forward([5, 6, 7], 0).shape == (3, m.vocab_size)


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_an_epcontext_model_without_its_binary_is_refused_in_one_line(pair, tmp_path):
    d = _copy(pair["npu"], tmp_path / "nobin")
    (d / "model_qnn.bin").unlink()
    with pytest.raises(ManifestError, match="model_qnn.bin listed in the manifest is missing"):
        open_model(d)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(pair["npu"] / "model.onnx", alone)
    with pytest.raises(ManifestError, match="no manifest.json"):
        open_model(alone)


def test_a_context_binary_for_another_soc_is_refused(pair, tmp_path):
    info = inspect_folder(pair["drafter"])
    export_static(load_model(info), info, context_len=CONTEXT, width=1, path=tmp_path / "g.onnx")
    other = qnn_export.compile_graph(tmp_path / "g.onnx", tmp_path / "g_ctx.onnx", soc="SM8550", fp16=True)
    d = _copy(pair["npu"], tmp_path / "swapped")
    shutil.copy(other, d / "model_qnn.bin")
    with pytest.raises(ManifestError, match=r"context binary for SM8550 \(HTP v73\), not the manifest's SM8650"):
        open_model(d)


def test_a_device_with_another_soc_is_told_which_soc_to_export_for(pair, monkeypatch):
    monkeypatch.setenv(qnn.SOC_ENV, "SM8750")
    with pytest.raises(ManifestError, match="compiled for SM8650 .HTP v75., and this device is SM8750.*--soc SM8750"):
        open_model(pair["npu"])


def test_an_op_the_htp_cannot_take_is_named(tmp_path):
    import numpy as np

    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8])
    w = onnx.numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
    nodes = [onnx.helper.make_node("MatMul", ["x", "w"], ["h"]), onnx.helper.make_node("Erf", ["h"], ["y"])]
    model = onnx.helper.make_model(
        onnx.helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[onnx.helper.make_opsetid("", 17)]
    )
    model.ir_version = 9
    onnx.save(model, tmp_path / "erf.onnx")
    with pytest.raises(ExportError, match="the HTP cannot take op.s. Erf"):
        qnn_export.compile_graph(tmp_path / "erf.onnx", tmp_path / "erf_ctx.onnx", soc="SM8650", fp16=True)


def test_too_large_for_a_context_binary_publishes_nothing(pair, tmp_path, monkeypatch):
    monkeypatch.setattr(qnn_export, "PROTOBUF_LIMIT", 1024)
    with pytest.raises(InvalidArgument, match="too large for one context binary"):
        export_model(pair["drafter"], "onnx", None, 64, tmp_path / "big", progress=False, device="qnn-htp")
    assert not (tmp_path / "big" / "manifest.json").exists() and not list((tmp_path / "big").glob("*.bin"))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--soc", "SM0000"], "unknown SoC 'SM0000'; choose one of: SM8350"),
        (["--quant", "int4"], "unknown quant 'int4' for format onnx on qnn-htp; choose one of: fp16, a16w8"),
        (["--call-widths", "1,x"], "--call-widths takes positive integers"),
        (["--onnx-path", "genai"], "builds its own static graph; drop --onnx-path"),
    ],
)
def test_cli_refuses_what_the_npu_path_cannot_take_in_one_line(pair, tmp_path, capsys, extra, message):
    argv = ["export", "--model", str(pair["drafter"]), "--format", "onnx", "--device", "qnn-htp"]
    code = main([*argv, "--out", str(tmp_path / "x"), "--no-progress", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and message in err[0], err


def test_without_onnxruntime_qnn_the_export_and_the_loader_name_the_extra(pair, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime_qnn", None)  # import fails as if not installed
    argv = ["export", "--model", str(pair["drafter"]), "--format", "onnx", "--device", "qnn-htp"]
    code = main([*argv, "--out", str(tmp_path / "x"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "pip install 'omnidraft[npu]'" in err[0], err
    with pytest.raises(InvalidArgument, match=r"onnxruntime-qnn is not installed.*omnidraft\[npu\]"):
        open_model(pair["npu"])
    assert json.loads((pair["npu"] / "manifest.json").read_text())["device"] == "qnn-htp"


def test_the_exactness_command_reports_identical_output_per_stream(pair, tmp_path, capsys):
    report = tmp_path / "exact.json"
    argv = ["exactness", "--drafter", str(pair["npu"]), "--target", str(pair["target"]), "--streams", "math"]
    code = main([*argv, "--prompts", "1", "--max-new-tokens", "6", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0 and "on qnn-htp (qnn-htp)" in out and "| math | ngram | 1 | 1 | 0 |" in out
    data = json.loads(report.read_text())
    assert data["pair"]["drafter_device"] == "qnn-htp" and data["streams"][0]["mismatches"] == []


def test_a_cpu_export_over_an_npu_one_leaves_no_stale_context_binaries(pair, tmp_path):
    d = _copy(pair["npu"], tmp_path / "reused")
    export_model(pair["drafter"], "onnx", "fp32", 32, d, progress=False, onnx_path="torch")
    assert load_manifest(d).device == "cpu"
    assert not [p.name for p in d.iterdir() if p.name.startswith("model_")]
