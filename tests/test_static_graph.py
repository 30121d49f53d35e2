"""The static-shape graph (fixed context, fixed call widths, KV buffers outside) computes what eager
PyTorch computes, through the parity schedule's prefill, decode, verify and rollback, on the CPU."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tiny_models import make_tiny_model

from omnidraft.errors import ExportError, InvalidArgument
from omnidraft.export import parity, recipes
from omnidraft.export.hf_model import inspect_folder, load_model
from omnidraft.export.qnn_export import check_static
from omnidraft.export.static_graph import export_static, unsupported_reason
from omnidraft.runtime.backends.static_kv import MASK_VALUE, StaticKvBackend, feeds

TOK = Path(__file__).resolve().parents[1] / "models" / "tokenizers"
CONTEXT = 48
WIDTHS = (1, 4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("static")
    # 4 query heads over 2 KV heads: the grouped-query path is exercised.
    return {a: make_tiny_model(root / a, a, TOK / "gpt2", seed=5, max_pos=128) for a in ("llama", "qwen2")}


def _backend(folder: Path, info, tmp: Path) -> StaticKvBackend:
    model = load_model(info)
    sessions = {}
    for w in WIDTHS:
        export_static(model, info, context_len=CONTEXT, width=w, path=tmp / f"w{w}.onnx")
        check_static(tmp / f"w{w}.onnx")
        sessions[w] = ort.InferenceSession(str(tmp / f"w{w}.onnx"), providers=["CPUExecutionProvider"])
    prov = parity.provisional_manifest("onnx", "fp32", info, CONTEXT, tmp / "w1.onnx", [], [])
    return StaticKvBackend(tmp, replace(prov, device_info={"context_len": CONTEXT}), sessions, name="static-cpu")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_static_graph_matches_eager_through_prefill_verify_and_rollback(tiny, arch, tmp_path):
    info = inspect_folder(tiny[arch])
    backend = _backend(tiny[arch], info, tmp_path)
    sched = parity.parity_tokens(info.folder / "tokenizer.json", info.vocab_size, CONTEXT)
    ref = parity.reference_logits(parity.hf_logits(load_model(info)), sched)
    fig = parity.compare(parity.run_artifact(backend, sched), *ref)
    assert fig["max_abs_diff"] <= recipes.FP32_MAX_ABS_DIFF * max(1.0, fig["logit_scale"] / 10)
    assert fig["top1_agreement"] == 1.0
    # Chunks of 3 run padded on the width-4 graph: the pad rows change nothing.
    ids = sched.tokens_a[:12]
    backend.reset()
    chunked = np.concatenate([backend.forward(ids[i : i + 3], i) for i in range(0, 12, 3)])
    np.testing.assert_allclose(chunked, ref[0][:12], atol=1e-4 * max(1.0, float(np.abs(ref[0]).max())))


def test_a_call_sees_the_cached_prefix_and_its_own_earlier_rows_only():
    f = feeds([7, 8], 3, 4, 10)
    bias = f["attention_bias"][0, 0]
    assert f["input_ids"].tolist() == [[7, 8, 0, 0]] and f["position_ids"].tolist() == [[3, 4, 5, 6]]
    assert (bias[:, :3] == 0).all() and (bias[:, 3:10] == MASK_VALUE).all()
    assert (bias[:, 10:] == np.where(np.tril(np.ones((4, 4))) > 0, 0.0, MASK_VALUE)).all()


def test_a_dynamic_dimension_is_refused(tmp_path):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, "k"])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, "k"])
    g = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(g), tmp_path / "dyn.onnx")
    with pytest.raises(ExportError, match="dynamic dimension left .x: k.*fixed shapes"):
        check_static(tmp_path / "dyn.onnx")


def test_models_whose_attention_is_not_static_are_refused(tiny, tmp_path):
    import json
    import shutil

    folder = tmp_path / "sliding"
    shutil.copytree(tiny["qwen2"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "use_sliding_window": True, "sliding_window": 16}))
    assert "sliding-window" in unsupported_reason(inspect_folder(folder))
    with pytest.raises(InvalidArgument, match="call width 64 exceeds the context of 48"):
        export_static(None, inspect_folder(tiny["llama"]), context_len=CONTEXT, width=64, path=tmp_path / "x.onnx")
