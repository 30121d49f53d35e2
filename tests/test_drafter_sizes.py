"""The drafter-shape step curve: shapes built from the drafter recipe, exported as deployed and timed,
with a table, JSON and PNG; bad shapes refused in one line before any export."""

from __future__ import annotations

import json

import pytest

from omnidraft.bench import drafter_sizes
from omnidraft.errors import InvalidArgument
from omnidraft.models.train import build_model, load_recipe


def test_a_shape_keeps_the_recipe_and_counts_its_parameters():
    r = drafter_sizes.shape_recipe(load_recipe("drafter"), 256, 3)
    m = r["model"]
    assert (m["hidden_size"], m["num_hidden_layers"], m["intermediate_size"]) == (256, 3, 768)
    assert m["num_attention_heads"] == 256 // drafter_sizes.HEAD_DIM and m["vocab_size"] == 32000
    assert drafter_sizes.parameters(r) == sum(p.numel() for p in build_model(r).parameters())
    base = drafter_sizes.shape_recipe(load_recipe("drafter"), 128, 2)["model"]
    assert base == load_recipe("drafter")["model"]  # the bundled drafter's own shape
    with pytest.raises(InvalidArgument, match="multiples of 32"):
        drafter_sizes.shape_recipe(load_recipe("drafter"), 100, 2)


def test_the_curve_is_measured_and_written(tmp_path, capsys):
    out = tmp_path / "sizes"
    code = drafter_sizes.main(
        [
            "--hidden",
            "64",
            "--layers",
            "1,2",
            "--repeats",
            "2",
            "--draft-vocab",
            "256",
            "--budget-ms",
            "50",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads((out / "drafter_sizes.json").read_text())
    assert [(r["hidden"], r["layers"]) for r in doc["rows"]] == [(64, 1), (64, 2)]
    assert all(r["step_ms"] > 0 and r["size_mib"] > 0 for r in doc["rows"])
    assert doc["rows"][0]["parameters"] < doc["rows"][1]["parameters"]
    assert (out / "drafter_sizes.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 64 | 2 |" in (out / "drafter_sizes.md").read_text() and "within budget" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--hidden", "100"], "multiples of 32"),
        (["--hidden", "a,b"], "comma-separated integers"),
        (["--layers", "0"], "at least one layer"),
        (["--repeats", "0"], "must be >= 1"),
    ],
)
def test_bad_shapes_get_one_line(tmp_path, capsys, argv, says):
    assert drafter_sizes.main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and not (tmp_path / "o").exists()
