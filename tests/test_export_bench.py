"""bench-export writes one row per format x quant with sizes, load time and k=1..8 medians."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_models import make_tiny_model

from omnidraft.bench.export_timing import plan
from omnidraft.cli import main
from omnidraft.errors import InvalidArgument

GPT2 = Path(__file__).resolve().parents[1] / "models" / "tokenizers" / "gpt2"


def test_plan_validates_and_expands():
    assert plan(["onnx"], None) == [("onnx", "fp32"), ("onnx", "int8"), ("onnx", "int4")]
    assert plan(None, ["fp32"]) == [("onnx", "fp32"), ("executorch", "fp32")]
    with pytest.raises(InvalidArgument, match="unknown format"):
        plan(["gguf"], None)
    with pytest.raises(InvalidArgument, match="unknown quant"):
        plan(["onnx"], ["int2"])
    with pytest.raises(InvalidArgument, match="no quant"):
        plan(["onnx"], ["8da4w"])


def test_bench_export_table(tmp_path, capsys):
    hf = make_tiny_model(tmp_path / "hf", "llama", GPT2, seed=4, max_pos=128)
    code = main(
        [
            "bench-export",
            "--model",
            str(hf),
            "--out",
            str(tmp_path / "b"),
            "--formats",
            "onnx",
            "--quants",
            "fp32,int4",
            "--max-seq-len",
            "48",
            "--context",
            "24",
            "--repeats",
            "3",
        ]
    )
    assert code == 0
    res = json.loads((tmp_path / "b" / "bench_export.json").read_text())
    rows = {(r["format"], r["quant"]): r for r in res["rows"]}
    assert set(rows) == {("onnx", "fp32"), ("onnx", "int4")}
    for r in rows.values():
        assert r["size_mib"] > 0 and r["load_ms"] > 0 and r["export_s"] > 0
        assert sorted(r["verify_ms"], key=int) == [str(k) for k in range(1, 9)]
        assert all(v > 0 for v in r["verify_ms"].values()) and r["step_ms"] == r["verify_ms"]["1"]
    assert rows["onnx", "int4"]["size_mib"] < rows["onnx", "fp32"]["size_mib"]
    md = (tmp_path / "b" / "bench_export.md").read_text()
    assert md.count("| onnx |") == 2 and "k=8 ms" in md
    assert "| onnx | int4 |" in capsys.readouterr().out
    # --reuse measures the existing exports again without re-exporting them
    assert (
        main(
            [
                "bench-export",
                "--model",
                str(hf),
                "--out",
                str(tmp_path / "b"),
                "--formats",
                "onnx",
                "--quants",
                "int4",
                "--max-seq-len",
                "48",
                "--context",
                "24",
                "--repeats",
                "3",
                "--reuse",
            ]
        )
        == 0
    )
    again = json.loads((tmp_path / "b" / "bench_export.json").read_text())["rows"]
    assert len(again) == 1 and again[0]["export_s"] is None


def test_bench_export_times_a_drafter_with_its_head_cut(tmp_path):
    import numpy as np

    from omnidraft.export.draft_vocab import write_counts

    hf = make_tiny_model(tmp_path / "hf", "llama", GPT2, seed=4, max_pos=128)
    counts = np.random.default_rng(0).integers(0, 1000, size=json.loads((hf / "config.json").read_text())["vocab_size"])
    write_counts(hf, counts, hf / "tokenizer.json", "test counts")
    common = ["--model", str(hf), "--formats", "onnx", "--quants", "fp32", "--max-seq-len", "48", "--context", "24"]
    assert main(["bench-export", *common, "--repeats", "3", "--out", str(tmp_path / "full")]) == 0
    assert (
        main(["bench-export", *common, "--repeats", "3", "--out", str(tmp_path / "cut"), "--draft-vocab", "128"]) == 0
    )
    full, cut = (json.loads((tmp_path / d / "bench_export.json").read_text()) for d in ("full", "cut"))
    assert cut["draft_vocab"] == 128 and full["draft_vocab"] is None
    assert cut["rows"][0]["size_mib"] < full["rows"][0]["size_mib"]
    assert "head cut to 128 tokens" in (tmp_path / "cut" / "bench_export.md").read_text()
