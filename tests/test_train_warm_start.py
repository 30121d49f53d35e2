"""Warm-started, distilled recipes: a drafter built from a real model's kept layers, trained against
a same-vocabulary teacher on a cut head, resumes bit-identically and refuses what cannot fit."""

import json

import pytest
import torch
from test_train_recipe import final_weights, tiny_recipe

from omnidraft.errors import InvalidArgument, ModelFolderError
from omnidraft.models import distill as D
from omnidraft.models import train as T
from omnidraft.models.train_resources import memory_estimate


def source_folder(tmp_path, layers: int = 3, **model):
    r = tiny_recipe()
    r["model"] = r["model"] | {"num_hidden_layers": layers} | model
    r["train"] = r["train"] | {"seed": 99}
    folder = tmp_path / "source"
    T.build_model(r).save_pretrained(str(folder))
    return folder


def warm_recipe(folder, layers=(2, 0)) -> dict:
    r = tiny_recipe()
    r["model"] = r["model"] | {"num_hidden_layers": len(layers)}
    r["init"] = {"model": str(folder), "layers": list(layers)}
    return r


def assert_computes_the_source(model, folder) -> torch.Tensor:
    """The warm-started ``model``'s logits equal the source folder's; returns the batch it checked."""
    src = D.load_teacher({"teacher": {"model": str(folder)}, "model": {"vocab_size": 50257}})
    batch = torch.randint(0, 50257, (2, 24), generator=torch.Generator().manual_seed(0))
    want = src(input_ids=batch).logits
    got = model(input_ids=batch).logits
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    return batch


def test_warm_start_copies_the_kept_layers_in_order(tmp_path):
    folder = source_folder(tmp_path)
    src = torch.nn.Module.state_dict(
        D.load_teacher({"teacher": {"model": str(folder)}, "model": {"vocab_size": 50257}})
    )
    model = T.build_model(warm_recipe(folder), warm=True).state_dict()
    for new, old in ((0, 2), (1, 0)):
        for k in ("self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight"):
            assert torch.equal(model[f"model.layers.{new}.{k}"], src[f"model.layers.{old}.{k}"])
    assert torch.equal(model["model.embed_tokens.weight"], src["model.embed_tokens.weight"])
    assert torch.equal(model["model.norm.weight"], src["model.norm.weight"])


def test_warm_start_that_does_not_fit_is_one_clear_error(tmp_path):
    folder = source_folder(tmp_path)
    r = warm_recipe(folder)
    r["model"]["intermediate_size"] = 48
    with pytest.raises(ModelFolderError, match="does not fit the weights.*copy its config"):
        T.build_model(r, warm=True)


@pytest.mark.parametrize(
    ("layers", "num_layers", "said"),
    [
        ((0, 1), 3, "lists 2 layers for a model of 3"),
        ((0, 7), 2, "names layer 7, which .* does not have \\(it has layers 0-2\\)"),
        ((0, True), 2, "names layer True"),
    ],
)
def test_init_layers_that_do_not_match_the_model_or_the_source_are_one_clear_error(tmp_path, layers, num_layers, said):
    r = warm_recipe(source_folder(tmp_path), layers=layers)
    r["model"]["num_hidden_layers"] = num_layers
    with pytest.raises(InvalidArgument, match=said):
        T.build_model(r, warm=True)


def wide_recipe(folder) -> dict:
    r = warm_recipe(folder, layers=(0, 1))
    r["init"]["widen"] = True
    r["model"] = r["model"] | {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4}
    r["model"]["num_key_value_heads"] = 2
    r["model"]["rms_norm_eps"] = 1e-12
    return r


def test_a_widened_warm_start_computes_the_source_and_trains_every_new_weight(tmp_path):
    # RMSNorm's eps is the one thing the scaled norm weights cannot carry over (tiny random weights
    # make it 0.25 % of the mean square here), so this pair leaves it out to check the rest exactly
    folder = source_folder(tmp_path, layers=2, rms_norm_eps=1e-12)
    wide = T.build_model(wide_recipe(folder), warm=True)
    batch = assert_computes_the_source(wide, folder)
    # zero writers must not make a saddle: the new dims and units get gradient from the first step
    wide(input_ids=batch, labels=batch).loss.backward()
    w = dict(wide.named_parameters())
    assert w["model.layers.0.mlp.down_proj.weight"].grad[16:].abs().sum() > 0
    assert w["model.layers.0.self_attn.o_proj.weight"].grad[:, 16:].abs().sum() > 0
    assert w["model.layers.1.mlp.up_proj.weight"].grad[32:].abs().sum() == 0  # their down columns are 0 yet
    assert w["model.layers.1.mlp.down_proj.weight"].grad[:, 32:].abs().sum() > 0


def test_a_deepened_warm_start_computes_the_source_and_its_new_layers_learn(tmp_path):
    # null layers start as the identity, so the deeper model's logits are the source's exactly
    folder = source_folder(tmp_path, layers=2)
    deep = T.build_model(warm_recipe(folder, layers=(0, None, 1, None)), warm=True)
    batch = assert_computes_the_source(deep, folder)
    deep(input_ids=batch, labels=batch).loss.backward()
    w = dict(deep.named_parameters())
    for j in (1, 3):
        assert w[f"model.layers.{j}.self_attn.o_proj.weight"].grad.abs().sum() > 0
        assert w[f"model.layers.{j}.mlp.down_proj.weight"].grad.abs().sum() > 0
    # a repeated index is a copy of that layer
    twice = T.build_model(warm_recipe(folder, layers=(0, 0, 1)), warm=True).state_dict()
    k = "self_attn.q_proj.weight"
    assert torch.equal(twice[f"model.layers.0.{k}"], twice[f"model.layers.1.{k}"])


def test_a_widening_that_changes_the_head_width_is_one_clear_error(tmp_path):
    folder = source_folder(tmp_path, layers=2)
    r = wide_recipe(folder)
    r["model"]["num_attention_heads"] = 2  # heads of 16 instead of the source's 8
    r["model"]["num_key_value_heads"] = 1
    with pytest.raises(ModelFolderError, match="cannot widen.*head width"):
        T.build_model(r, warm=True)


def test_teacher_of_another_vocabulary_is_refused(tmp_path):
    r = tiny_recipe() | {"teacher": {"model": str(source_folder(tmp_path))}}
    r["model"] = r["model"] | {"vocab_size": 32000}
    with pytest.raises(InvalidArgument, match="must share the drafter's vocabulary"):
        D.load_teacher(r)


def test_cut_head_over_every_token_is_the_plain_loss():
    r = tiny_recipe()
    model = T.build_model(r)
    batch = torch.randint(0, 50257, (2, 16))
    with torch.no_grad():
        cut = D.step_loss(model, batch, teacher=None, kd={}, kept=torch.arange(50257))
        plain = model(input_ids=batch, labels=batch).loss
    assert cut.item() == pytest.approx(plain.item(), rel=1e-5)


def test_a_student_equal_to_its_teacher_has_no_distillation_loss():
    r = tiny_recipe()
    model = T.build_model(r)
    batch = torch.randint(0, 50257, (2, 16))
    with torch.no_grad():
        loss = D.step_loss(model, batch, teacher=model, kd={"weight": 1.0, "temperature": 2.0}, kept=torch.arange(500))
    assert abs(loss.item()) < 1e-5


def test_head_tokens_are_the_most_frequent_of_the_rows():
    r = tiny_recipe()
    r["train"] = r["train"] | {"head_tokens": 3}
    rows = torch.tensor([[5, 5, 5, 9, 9, 1], [7, 7, 9, 5, 2, 2]]).numpy()
    assert D.head_tokens(r, rows).tolist() == [2, 5, 9] or D.head_tokens(r, rows).tolist() == [5, 7, 9]
    assert D.head_tokens(tiny_recipe(), rows) is None


def test_interrupted_distillation_resumes_to_identical_weights(tmp_path):
    folder = source_folder(tmp_path)
    r = warm_recipe(folder)
    r["teacher"] = {"model": str(folder), "weight": 0.9, "temperature": 1.0}
    r["train"] = r["train"] | {"head_tokens": 256, "freeze": ["model.embed_tokens"]}
    full = T.train(r, work_dir=tmp_path / "a", out_dir=None, resume=False, quiet=True)
    T.train(r, work_dir=tmp_path / "b", out_dir=None, resume=False, stop_after=3, quiet=True)
    resumed = T.train(r, work_dir=tmp_path / "b", out_dir=None, resume=True, quiet=True)
    assert resumed == full
    a, b = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the layers trained; the frozen embedding is the warm start's, untouched
    src = T.build_model(r, warm=True).state_dict()
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], src["model.layers.0.mlp.up_proj.weight"])
    assert torch.equal(a["model.embed_tokens.weight"], src["model.embed_tokens.weight"])
    assert json.loads((tmp_path / "a" / "loss_curve.json").read_text())["losses"] == full


def test_drafter_v2_recipe_is_a_warm_started_drafter_of_its_own_vocabulary():
    from omnidraft.models.sources import registry

    r = T.load_recipe("drafter-v2")
    assert len(r["init"]["layers"]) == r["model"]["num_hidden_layers"]
    assert r["tokenizer"] == f"model:{r['init']['model']}" and r["teacher"]["model"] in registry()
    # a generic drafter: its vocabulary is none of the real targets'
    assert r["model"]["vocab_size"] not in (151936, 262144)
    assert r["train"]["head_tokens"] < r["model"]["vocab_size"]


def test_recipe_too_big_for_memory_is_refused_up_front_with_the_estimate(tmp_path, capsys):
    r = tiny_recipe()
    small = memory_estimate(r)
    r["train"] = r["train"] | {"batch_size": 10**6}
    assert memory_estimate(r) > 100 * small
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(r))
    assert T.main(["--recipe", str(path), "--work-dir", str(tmp_path / "w"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs about" in err[0] and "GiB" in err[0] and "lower train.batch_size" in err[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "w" / "checkpoints").exists()
