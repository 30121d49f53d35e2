"""GGUF in: a GGUF file the test writes itself converts to a model folder with the same logits, and
is accepted wherever a model is named (`import-gguf`, `export --model FILE.gguf`, `generate`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import make_tiny_bpe, make_tiny_model, write_gguf

from omnidraft.cli import main
from omnidraft.errors import ModelFolderError
from omnidraft.models.gguf_import import import_gguf, inspect_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    model = make_tiny_model(root / "hf", "qwen2", make_tiny_bpe(root / "tok"), seed=3, hidden=32, max_pos=1024)
    return {"hf": model, "gguf": write_gguf(model, root / "tiny-qwen2.gguf"), "root": root}


def test_imported_folder_gives_the_original_logits_and_a_working_tokenizer(tiny_gguf, tmp_path):
    from transformers import AutoModelForCausalLM

    from omnidraft.runtime.tokenizer import load_codec

    out = import_gguf(tiny_gguf["gguf"], tmp_path / "imported", progress=False)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    assert not any(n.startswith(".") for n in names)
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(tiny_gguf["hf"]).eval()(ids).logits
        got = AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits
    assert torch.equal(want, got)  # F32 tensors round-trip bit for bit
    codec = load_codec(out)
    text = "def fibonacci(n):\n    return n  # ünïcödé"
    assert codec.decode(codec.encode(text)) == text
    eos = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    assert codec.tokenizer.token_to_id("<|im_end|>") in eos
    template = out / "chat_template.jinja"
    assert template.is_file() and "<|im_start|>" in template.read_text()


def test_export_takes_a_gguf_file_directly(tiny_gguf, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path / "cache"))  # where the converted folder is kept
    rc = main(["export", "--model", str(tiny_gguf["gguf"]), "--format", "onnx", "--quant", "fp32",
               "--max-seq-len", "96", "--out", str(tmp_path / "exp"), "--no-progress"])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "exp" / "manifest.json").read_text())
    assert manifest["architecture"] == "Qwen2ForCausalLM"
    assert manifest["parity"]["max_abs_diff"] < 1e-4


def test_generate_accepts_a_gguf_target(tiny_gguf, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path / "cache"))
    argv = ["generate", "--target", str(tiny_gguf["gguf"]), "--prompt", "def fib", "--mode", "target-only"]
    assert main([*argv, "--max-new-tokens", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 6


def test_cli_import_writes_the_folder(tiny_gguf, tmp_path, capsys):
    assert main(["import-gguf", str(tiny_gguf["gguf"]), "--out", str(tmp_path / "m"), "--no-progress"]) == 0
    assert Path(capsys.readouterr().out.strip()) == tmp_path / "m"
    assert (tmp_path / "m" / "model.safetensors").is_file()


def _one_line_error(argv: list[str], capsys) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "\n" not in err and "Traceback" not in err, err
    return err


def test_bad_gguf_files_get_one_line_and_leave_nothing(tiny_gguf, tmp_path, capsys):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 not a gguf at all")
    truncated = tmp_path / "truncated.gguf"
    data = tiny_gguf["gguf"].read_bytes()
    truncated.write_bytes(data[: len(data) * 2 // 3])
    out = tmp_path / "out"
    assert "not a GGUF file" in _one_line_error(["import-gguf", str(not_gguf), "--out", str(out)], capsys)
    assert "truncated" in _one_line_error(["import-gguf", str(truncated), "--out", str(out)], capsys)
    assert "no such file" in _one_line_error(["import-gguf", str(tmp_path / "absent.gguf"), "--out", str(out)], capsys)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "truncated.gguf"]


def test_an_architecture_transformers_cannot_load_is_refused(tmp_path):
    import gguf

    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "rwkv6")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFolderError, match="architecture 'rwkv6' is not one transformers"):
        inspect_gguf(path)


def test_a_disk_without_room_is_refused_before_writing(tiny_gguf, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage(1 << 30, 1 << 30, 1024))
    with pytest.raises(ModelFolderError, match="GiB free"):
        import_gguf(tiny_gguf["gguf"], tmp_path / "m", progress=False)
    assert not (tmp_path / "m").exists() and list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_replaced_only_by_a_complete_one(tiny_gguf, tmp_path):
    out = tmp_path / "m"
    import_gguf(tiny_gguf["gguf"], out, progress=False)
    before = (out / "model.safetensors").read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(tiny_gguf["gguf"].read_bytes()[:-1000])
    with pytest.raises(ModelFolderError):
        import_gguf(bad, out, progress=False)
    assert (out / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf", "m"]


def test_instruct_prompts_are_wrapped_in_the_chat_template_and_output_stays_exact(tiny_gguf, tmp_path, capsys):
    from omnidraft.models.streams import load_stream
    from omnidraft.runtime.decode_config import DecodeConfig
    from omnidraft.runtime.loader import load_model
    from omnidraft.runtime.ngram_cache import NgramCache
    from omnidraft.runtime.speculative import SpeculativeDecoder

    target = import_gguf(tiny_gguf["gguf"], tmp_path / "instruct", progress=False)
    raw = load_stream("code", "test")[:3]
    wrapped = load_stream("code", "test", target=target)[:3]
    for r, w in zip(raw, wrapped):
        assert w.prompt == f"<|im_start|>user\n{r.prompt}<|im_end|>\n<|im_start|>assistant\n"
    tgt = load_model(target)
    assert tgt.codec.encode(wrapped[0].prompt)[0] == tgt.codec.tokenizer.token_to_id("<|im_start|>")
    tok = Path(__file__).resolve().parents[1] / "models" / "tokenizers" / "phi3"
    drf = load_model(make_tiny_model(tiny_gguf["root"] / "drafter", "llama", tok, seed=5, max_pos=256))
    dec = SpeculativeDecoder(tgt, drf, NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size))
    for p in wrapped:
        ref = dec.generate(p.prompt, DecodeConfig(max_new_tokens=12, mode="target-only"))
        for mode in ("dm", "ngram"):
            assert dec.generate(p.prompt, DecodeConfig(max_new_tokens=12, mode=mode)).token_ids == ref.token_ids
    base = tiny_gguf["hf"]  # the original folder has no template: --chat on is refused, auto leaves the prompt
    capsys.readouterr()
    assert "no chat template" in _one_line_error(
        ["generate", "--target", str(base), "--prompt", "x", "--mode", "target-only", "--chat", "on"], capsys
    )
