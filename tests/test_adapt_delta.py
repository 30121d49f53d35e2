"""LoRA deltas on disk: PEFT layout, pair identity and refusal, merge, crash safety (SIGKILL mid-write)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import make_tiny_model

from omnidraft.adapt import delta
from omnidraft.adapt.trainer import wrap_lora
from omnidraft.errors import AdapterError
from omnidraft.runtime.loader import load_model

IDS = [[1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tokenizer_path):
    root = tmp_path_factory.mktemp("tiny-adapt-delta")
    d = make_tiny_model(root / "d", "llama", tokenizer_path("llama-spm"), seed=1)
    d2 = make_tiny_model(root / "d2", "llama", tokenizer_path("llama-spm"), seed=5)
    t = make_tiny_model(root / "t", "qwen2", tokenizer_path("gpt-2"), seed=2)
    t2 = make_tiny_model(root / "t2", "qwen2", tokenizer_path("gpt-2"), seed=3)
    return d, d2, t, t2


def _lora_model(folder: Path, seed: int = 0, rank: int = 4):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = wrap_lora(base, rank)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:  # B starts at 0; make the delta visible
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.eval()


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor(IDS)).logits[0]


def test_save_load_round_trip_and_peft_layout(pair, tmp_path):
    d, _, t, _ = pair
    ident = delta.PairIdentity.of(d, t)
    model = _lora_model(d, seed=0)
    folder = delta.save_adapter(model, tmp_path / ident.target_id / "adapter", ident, {"updates": 3})
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    fresh = _lora_model(d, seed=9)
    meta = delta.load_adapter(fresh, folder, ident)
    assert meta["drafter_weights"] == ident.drafter_weights and '"updates": 3' in meta["info"]
    assert torch.equal(_logits(fresh), _logits(model))
    # Plain PEFT reads the same folder.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32), str(folder)).eval()
    assert torch.allclose(_logits(plain), _logits(model), atol=1e-6)


def test_delta_of_another_drafter_or_target_is_refused(pair, tmp_path):
    d, d2, t, t2 = pair
    ident = delta.PairIdentity.of(d, t)
    folder = delta.save_adapter(_lora_model(d), tmp_path / "adapter", ident)
    for other, who in ((delta.PairIdentity.of(d2, t), "drafter"), (delta.PairIdentity.of(d, t2), "target")):
        with pytest.raises(AdapterError, match=f"another {who}"):
            delta.load_adapter(_lora_model(d), folder, other)
    assert delta.PairIdentity.of(d, t2).target_id != ident.target_id
    with pytest.raises(AdapterError, match="--lora-rank"):
        delta.load_adapter(_lora_model(d, rank=8), folder, ident)
    (folder / "adapter_model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(AdapterError, match="damaged"):
        delta.load_adapter(_lora_model(d), folder, ident)


def test_merged_drafter_gives_the_unmerged_logits(pair, tmp_path):
    d, _, t, _ = pair
    ident = delta.PairIdentity.of(d, t)
    model = _lora_model(d, seed=3)
    out = delta.write_merged(model, d, tmp_path / "drafter", ident)
    merged = load_model(out)
    got = merged.backend.forward(IDS[0], 0)
    want = _logits(model).numpy()
    assert np.abs(got - want).max() < 1e-5 * max(1.0, np.abs(want).max())  # fp32 rounding of merged weights
    assert np.abs(want - _logits(_lora_model(d, seed=3).get_base_model()).numpy()).max() > 1e-2  # the delta matters
    assert (out / "tokenizer.json").read_bytes() == (d / "tokenizer.json").read_bytes()
    # Merging worked on a copy: the live model still carries its LoRA layers and the same outputs.
    assert any("lora_A" in n for n, _ in model.named_parameters())
    assert np.array_equal(_logits(model).numpy(), want)


_CHILD = textwrap.dedent("""
    import os, sys, time, torch
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from test_adapt_delta import _lora_model
    from omnidraft.adapt import delta
    d, t, final, marker, what = map(Path, sys.argv[1:6])
    ident = delta.PairIdentity.of(d, t)
    model = _lora_model(d, seed=7)

    def hang():
        marker.write_text("now")
        time.sleep(120)

    if what.name == "weights":  # slow writer: half a file, then hang
        import safetensors.torch as st
        def slow_save(tensors, path, metadata=None):
            Path(path).write_bytes(b"partial")
            hang()
        st.save_file = slow_save
        delta.save_adapter(model, final, ident)
    elif what.name == "rename":  # crash between moving the old folder aside and moving the new one in
        from omnidraft import atomic
        atomic._exchange = lambda a, b: False  # the two-rename swap of filesystems without renameat2
        real = os.rename
        def slow_rename(a, b):
            real(a, b)
            if str(b).endswith(".prev"):
                hang()
        os.rename = slow_rename
        delta.save_adapter(model, final, ident)
    else:  # merge: the HF writer hangs mid-way
        from transformers import PreTrainedModel
        def slow_pretrained(self, path, **kw):
            (Path(path) / "model.safetensors").write_bytes(b"partial")
            hang()
        PreTrainedModel.save_pretrained = slow_pretrained
        delta.write_merged(model, d, final, ident)
""")


def _kill_mid_write(tmp_path: Path, d: Path, t: Path, final: Path, what: str) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(tests=str(Path(__file__).parent)))
    marker = tmp_path / f"marker-{what}"
    proc = subprocess.Popen([sys.executable, str(script), str(d), str(t), str(final), str(marker), what])
    try:
        deadline = time.time() + 90
        while not marker.exists():
            assert proc.poll() is None, "the writer exited before reaching the write"
            assert time.time() < deadline, "the writer never reached the write"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("what", ["weights", "rename"])
def test_killed_adapter_save_leaves_the_previous_adapter(pair, tmp_path, what):
    d, _, t, _ = pair
    ident = delta.PairIdentity.of(d, t)
    final = tmp_path / "adapter"
    previous = _lora_model(d, seed=1)
    delta.save_adapter(previous, final, ident)
    want = _logits(previous)
    _kill_mid_write(tmp_path, d, t, final, what)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith((".adapter.tmp-", "adapter.prev"))]
    assert leftovers, "the kill should have left a temp or .prev folder behind"
    fresh = _lora_model(d, seed=9)
    delta.load_adapter(fresh, final, ident)  # recovers .prev if needed, drops temp folders
    assert torch.equal(_logits(fresh), want)
    assert not any(p.name.startswith(".adapter.tmp-") for p in tmp_path.iterdir())


def test_killed_merge_leaves_the_previous_drafter(pair, tmp_path):
    d, _, t, _ = pair
    ident = delta.PairIdentity.of(d, t)
    final = tmp_path / "drafter"
    previous = _lora_model(d, seed=1)
    delta.write_merged(previous, d, final, ident)
    want = load_model(final).backend.forward(IDS[0], 0)
    _kill_mid_write(tmp_path, d, t, final, "merge")
    assert any(p.name.startswith(".drafter.tmp-") for p in tmp_path.iterdir())
    got = load_model(final).backend.forward(IDS[0], 0)
    assert np.array_equal(got, want)
