"""ExecuTorch delegates: every delegate the installed packages can lower to takes the drafter's
program, and the .pte's own delegation table names it; what cannot run here says so in one line.

Lowering takes tens of seconds per delegate even for a one-layer model, so each exports one width at
the smallest context the parity schedule fits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tiny_models import make_tiny_model

from omnidraft.errors import InvalidArgument, ModelFolderError
from omnidraft.export.et_delegates import DELEGATES, delegation_info
from omnidraft.export.pipeline import export_model
from omnidraft.runtime.loader import load_model
from omnidraft.runtime.manifest import load_manifest

TOK = Path(__file__).resolve().parents[1] / "models" / "tokenizers"
CONTEXT = 24
# The partitioner each delegate imports; openvino and ethos-u come with extras that pin versions
# omnidraft's own environment cannot take (a separate environment, see the README's Devices).
NEEDS = {"coreml": "coremltools", "vulkan": "executorch", "openvino": "nncf"}


@pytest.fixture(scope="module")
def drafter(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("d") / "d", "llama", TOK / "phi3", seed=1, layers=1, max_pos=64)


def test_the_default_xnnpack_program_names_xnnpack_in_its_delegation_table(drafter, tmp_path):
    d = export_model(drafter, "executorch", "fp32", CONTEXT, tmp_path / "x", progress=False).out_dir
    m = load_manifest(d)
    assert m.device == "cpu" and "XnnpackBackend" in delegation_info(d / m.artifact_file)["forward"]


@pytest.mark.parametrize("delegate", sorted(NEEDS))
def test_each_installed_delegate_lowers_the_drafter_and_the_pte_names_it(drafter, tmp_path, delegate):
    if importlib.util.find_spec(NEEDS[delegate]) is None:
        pytest.skip(f"the {delegate} partitioner needs {DELEGATES[delegate].install} (a separate environment)")
    out = tmp_path / delegate
    corpus = tmp_path / "corpus.txt"  # a trimmed output layer: the rows are widened as the runtime does
    corpus.write_text("def add(a, b):\n    return a + b\n" * 20 + "The quick brown fox jumps over the lazy dog. " * 20)
    export_model(
        drafter,
        "executorch",
        "fp32",
        CONTEXT,
        out,
        progress=False,
        delegate=delegate,
        call_widths="1",
        draft_vocab=256,
        vocab_corpus=corpus,
    )
    m = load_manifest(out)
    spec = DELEGATES[delegate]
    assert m.device == delegate and m.device_info["delegate"] == delegate
    assert delegation_info(out / "model.pte") == {"forward_w1": [spec.backend_id]} == m.device_info["delegation"]
    assert m.device_info["runs_here"] == ("yes (ExecuTorch runtime)" if spec.runs_here else "no: lowered only")
    assert m.draft_vocab["size"] == 256
    assert m.parity["max_abs_diff"] <= 1e-4 and m.parity["top1_agreement"] == 1.0
    if spec.runs_here:
        assert m.parity["ran"] == f"the .pte on ExecuTorch's {spec.backend_id}"
        assert load_model(out).backend.forward([5, 6], 0).shape == (2, m.vocab_size)
    else:
        assert "the delegate did not run" in m.parity["ran"]
        with pytest.raises(ModelFolderError, match=f"lowered to {delegate}.*has no {spec.backend_id}"):
            load_model(out)


def test_delegates_refuse_what_they_cannot_take_in_one_line(drafter, tmp_path):
    with pytest.raises(InvalidArgument, match="--delegate applies to --format executorch only"):
        export_model(drafter, "onnx", "fp32", CONTEXT, tmp_path / "a", progress=False, delegate="coreml")
    with pytest.raises(InvalidArgument, match="unknown delegate 'hexagon'"):
        export_model(drafter, "executorch", "fp32", CONTEXT, tmp_path / "b", progress=False, delegate="hexagon")
    with pytest.raises(InvalidArgument, match="lowers the fp32 program.*use --quant fp32"):
        export_model(drafter, "executorch", "8da4w", CONTEXT, tmp_path / "c", progress=False, delegate="vulkan")
    with pytest.raises(InvalidArgument, match="Ethos-U|executorch.ethos-u."):
        export_model(drafter, "executorch", "fp32", CONTEXT, tmp_path / "e", progress=False, delegate="ethos-u")
    assert not any((tmp_path / n / "manifest.json").exists() for n in "abce")
