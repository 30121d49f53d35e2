"""Training recipes: an interrupted run resumes from its last checkpoint and ends with exactly the
weights of an uninterrupted run; the export is a loadable half-precision HF folder."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from omnidraft.errors import InvalidArgument, ModelFolderError
from omnidraft.models import train as T
from omnidraft.models.checkpoints import load_checkpoint

GPT2 = Path(T.MODELS_DIR) / "tokenizers" / "gpt2" / "tokenizer.json"


def tiny_recipe() -> dict:
    return {
        "name": "tiny",
        "arch": "qwen2",
        "tokenizer": str(GPT2),
        "commit_tokenizer": True,
        "model": {
            "vocab_size": 50257,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 128,
            "tie_word_embeddings": True,
        },
        "data": {"mix": {"math": 1.0}, "seq_len": 32, "eos_id": 50256, "chars_per_token": 3},
        "train": {
            "seed": 7,
            "steps": 6,
            "batch_size": 2,
            "lr": 0.01,
            "min_lr_ratio": 0.1,
            "warmup_steps": 2,
            "weight_decay": 0.1,
            "grad_clip": 1.0,
            "checkpoint_every": 2,
            "threads": 1,
        },
        "export": {"dtype": "float16"},
    }


def final_weights(work: Path) -> dict:
    latest = json.loads((work / "checkpoints" / "latest.json").read_text())
    return load_file(str(work / "checkpoints" / latest["dir"] / "model.safetensors"))


def test_interrupted_run_resumes_to_identical_weights(tmp_path):
    r = tiny_recipe()
    full = T.train(r, work_dir=tmp_path / "a", out_dir=None, resume=False, quiet=True)
    # interrupted after step 3: the last checkpoint is step 2, so steps 3.. are redone on resume
    part = T.train(r, work_dir=tmp_path / "b", out_dir=None, resume=False, stop_after=3, quiet=True)
    assert len(part) == 3
    assert json.loads((tmp_path / "b" / "checkpoints" / "latest.json").read_text())["step"] == 2
    resumed = T.train(r, work_dir=tmp_path / "b", out_dir=None, resume=True, quiet=True)
    assert resumed == full
    a, b = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert full[-1][1] < full[0][1]  # it learns something


def test_half_written_checkpoint_is_ignored(tmp_path):
    r = tiny_recipe()
    T.train(r, work_dir=tmp_path, out_dir=None, resume=False, stop_after=2, quiet=True)
    ck = tmp_path / "checkpoints"
    # a crash while writing leaves a hidden temp folder and no new latest.json: resume ignores it
    junk = ck / ".step-000004-crash"
    junk.mkdir()
    (junk / "model.safetensors").write_bytes(b"partial")
    model = T.build_model(r)
    step, losses = load_checkpoint(ck, model, T._make_optimizer(model, r["train"]))
    assert step == 2 and len(losses) == 2


def test_damaged_checkpoint_is_a_clear_error(tmp_path):
    r = tiny_recipe()
    T.train(r, work_dir=tmp_path, out_dir=None, resume=False, stop_after=2, quiet=True)
    latest = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    (tmp_path / "checkpoints" / latest["dir"] / "optimizer.safetensors").write_bytes(b"garbage")
    model = T.build_model(r)
    with pytest.raises(ModelFolderError, match="delete that folder"):
        load_checkpoint(tmp_path / "checkpoints", model, T._make_optimizer(model, r["train"]))


def test_export_is_a_half_precision_hf_folder(tmp_path):
    from transformers import AutoModelForCausalLM

    r = tiny_recipe()
    out = tmp_path / "out"
    T.train(r, work_dir=tmp_path / "w", out_dir=out, resume=False, quiet=True)
    for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "loss_curve.json"):
        assert (out / f).is_file(), f
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    m = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ref = T.build_model(r)
    ref.load_state_dict(final_weights(tmp_path / "w"), strict=False)  # lm_head is tied to embed_tokens
    x = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(m(x).logits, ref(x).logits, atol=5e-2)
    assert (tmp_path / "w" / "loss.png").stat().st_size > 1000


def test_lr_schedule_warms_up_and_decays():
    tr = tiny_recipe()["train"] | {"steps": 100, "warmup_steps": 10}
    lrs = [T.lr_at(s, tr) for s in range(100)]
    assert lrs[0] < lrs[9] == pytest.approx(tr["lr"])
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[-1] >= tr["lr"] * tr["min_lr_ratio"]


def test_unknown_recipe_lists_valid_ones():
    with pytest.raises(InvalidArgument, match="use one of drafter, drafter-teachers, drafter-v2, target or a path"):
        T.load_recipe("nope")


@pytest.mark.parametrize("name", ["drafter", "target"])
def test_bundled_recipes_are_consistent(name):
    r = T.load_recipe(name)
    assert sum(r["data"]["mix"].values()) == pytest.approx(1.0)
    if name == "drafter":
        # A generic drafter: mostly prose, with the code and worked-arithmetic text a general corpus holds.
        mix = r["data"]["mix"]
        assert r["arch"] == "llama" and r["model"]["num_hidden_layers"] == 2 and max(mix.values()) == mix["text"]
        assert r["model"]["vocab_size"] == 32000
    else:
        assert r["arch"] == "qwen2" and set(r["data"]["mix"]) == {"code", "math", "text"}
        assert r["model"]["vocab_size"] >= 50257
