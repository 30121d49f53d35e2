"""Training on an accelerator: the same recipe with a batch several recipe steps wide sees exactly
the recipe's data in the recipe's order and learning-rate schedule, resumes at another scale, and a
device this machine lacks is one clear line before anything is built."""

import json

import pytest
import torch
from test_train_recipe import final_weights, tiny_recipe

from omnidraft.errors import InvalidArgument
from omnidraft.models import train as T
from omnidraft.models.train_resources import resolve_device


def _record_batches(monkeypatch) -> tuple[list, list]:
    seen, lrs = [], []
    real_loss, real_lr = T.step_loss, T.lr_at

    def loss(model, batch, **kw):
        seen.append(batch.clone())
        return real_loss(model, batch, **kw)

    def lr(step, tr):
        lrs.append(step)
        return real_lr(step, tr)

    monkeypatch.setattr(T, "step_loss", loss)
    monkeypatch.setattr(T, "lr_at", lr)
    return seen, lrs


@pytest.mark.parametrize("scale", [2, 4])
def test_a_scaled_batch_is_the_recipe_data_in_order_with_fewer_updates(tmp_path, monkeypatch, scale):
    r = tiny_recipe()  # 6 steps of 2 rows
    seen, lrs = _record_batches(monkeypatch)
    T.train(r, work_dir=tmp_path / "one", out_dir=None, resume=False, quiet=True)
    one, lr_one = torch.cat(seen), list(lrs)
    seen.clear(), lrs.clear()
    losses = T.train(r, work_dir=tmp_path / "n", out_dir=None, resume=False, quiet=True, batch_scale=scale)
    sizes = [len(b) for b in seen]
    assert sizes == [2 * min(scale, 6 - s) for s in range(0, 6, scale)]  # the last update takes what is left
    assert torch.equal(torch.cat(seen), one)
    # each update at the schedule's rate for its first recipe step (asked once per parameter group)
    assert sorted(set(lrs)) == sorted(set(lr_one))[::scale]
    assert [s for s, _ in losses] == [min(s + scale, 6) for s in range(0, 6, scale)]
    assert json.loads((tmp_path / "n" / "checkpoints" / "latest.json").read_text())["step"] == 6


def test_one_scaled_update_follows_the_mean_gradient_of_its_steps(tmp_path):
    """The corpus loss over the wider batch is the mean of the per-step losses (equal rows): the
    gradient a bigger batch follows is the average of the recipe steps' gradients."""
    r = tiny_recipe()
    model = T.build_model(r)
    tok, _ = T.load_tokenizer(r["tokenizer"])
    rows = torch.from_numpy(T.build_rows(r, tok)).long()

    def grad(batch):
        model.zero_grad()
        T.step_loss(model, batch, teacher=None, kd={}, kept=None).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    both = grad(rows[0:4])
    mean = (grad(rows[0:2]) + grad(rows[2:4])) / 2
    assert torch.allclose(both, mean, rtol=1e-4, atol=1e-6 * mean.abs().max().item())


def test_a_run_resumes_at_another_batch_scale(tmp_path):
    r = tiny_recipe()  # checkpoints every 2 recipe steps
    part = T.train(r, work_dir=tmp_path / "w", out_dir=None, resume=False, quiet=True, batch_scale=2, stop_after=4)
    assert [s for s, _ in part] == [2, 4]
    done = T.train(r, work_dir=tmp_path / "w", out_dir=None, resume=True, quiet=True, batch_scale=1)
    assert [s for s, _ in done] == [2, 4, 5, 6]
    assert final_weights(tmp_path / "w")


def test_a_device_this_machine_lacks_is_one_line_before_anything_is_built(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(InvalidArgument, match="--device cpu"):
        resolve_device("cuda")
    with pytest.raises(InvalidArgument, match="choose from"):
        resolve_device("tpu")
    with pytest.raises(InvalidArgument, match="choose from"):
        resolve_device("cuda:x")
    assert resolve_device("auto") == resolve_device("cpu") or resolve_device("auto").type == "mps"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(tiny_recipe()))
    args = ["--recipe", str(path), "--work-dir", str(tmp_path / "w"), "--out", str(tmp_path / "out")]
    assert T.main([*args, "--device", "cuda"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train: error: --device cuda") and "Traceback" not in err[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "w" / "checkpoints").exists()
    assert T.main([*args, "--batch-scale", "0"]) == 1
    assert "--batch-scale must be 1 or more" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_run_learns_what_the_cpu_run_learns(tmp_path):
    r = tiny_recipe()
    cpu = T.train(r, work_dir=tmp_path / "cpu", out_dir=None, resume=False, quiet=True)
    gpu = T.train(r, work_dir=tmp_path / "gpu", out_dir=None, resume=False, quiet=True, device="cuda")
    a, b = final_weights(tmp_path / "cpu"), final_weights(tmp_path / "gpu")
    assert all(torch.allclose(a[k], b[k], rtol=1e-3, atol=1e-3 * a[k].abs().max().item()) for k in a)
    assert abs(cpu[-1][1] - gpu[-1][1]) <= 1e-3 * abs(cpu[-1][1])
