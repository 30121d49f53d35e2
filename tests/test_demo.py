"""`omnidraft demo` refuses a missing/damaged bundled pair and unknown streams in one line."""

from __future__ import annotations

import json

import pytest
from tiny_models import make_tiny_model

from omnidraft.bench import bundled
from omnidraft.cli import main
from omnidraft.errors import ModelFolderError


@pytest.fixture()
def fake_bundled(tmp_path, tokenizer_path, monkeypatch):
    make_tiny_model(tmp_path / "drafter", "llama", tokenizer_path("llama-spm"), seed=1)
    make_tiny_model(tmp_path / "target", "qwen2", tokenizer_path("gpt-2"), seed=2)
    monkeypatch.setattr(bundled, "BUNDLED", tmp_path)
    monkeypatch.setattr(bundled.check_bundled, "__defaults__", (tmp_path,))
    return tmp_path


def test_intact_pair_passes(fake_bundled):
    assert set(bundled.check_bundled()) == {"drafter", "target"}


@pytest.mark.parametrize(
    "role,name,damage",
    [
        ("target", "model.safetensors", "truncate"),
        ("drafter", "tokenizer.json", "delete"),
        ("target", "config.json", "garble"),
    ],
)
def test_missing_or_damaged_file_is_named_with_a_fix(fake_bundled, role, name, damage):
    f = fake_bundled / role / name
    if damage == "delete":
        f.unlink()
    elif damage == "truncate":
        f.write_bytes(f.read_bytes()[:100])
    else:
        f.write_text("{not json")
    with pytest.raises(ModelFolderError) as err:
        bundled.check_bundled()
    msg = str(err.value)
    assert str(f) in msg and ("setup.sh" in msg or "git checkout" in msg)


def test_cli_names_the_bad_file_in_one_line(fake_bundled, capsys):
    (fake_bundled / "target" / "model.safetensors").unlink()
    assert main(["demo", "--pair", "tiny", "--backend", "torch", "--quick", "--streams", "code"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.safetensors is missing" in err[0]


def test_unknown_stream_lists_the_valid_ones(capsys):
    assert main(["demo", "--streams", "poetry"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "code, math, text" in err[0]


def test_demo_runs_end_to_end_on_a_tiny_pair(fake_bundled, tmp_path, capsys):
    out = tmp_path / "report"
    assert (
        main(
            [
                "demo",
                "--pair",
                "tiny",
                "--backend",
                "torch",
                "--streams",
                "math",
                "--prompts",
                "2",
                "--max-new-tokens",
                "8",
                "--adapt-prompts",
                "3",
                "--adapt-engine",
                "eager",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert "| bundled target | math | as shipped |" in table and "| bundled target | math | adapted |" in table
    report = json.loads((out / "report.json").read_text())
    assert [r["phase"] for r in report["rows"]] == ["as shipped", "adapted"]
    assert all(r["identical_to_target_only"] for r in report["rows"])  # adaptation changes speed, never text
    summary = report["adaptation"]["bundled target/math"]
    assert summary["train_prompts"] == 3 and summary["updates"] == 1
    assert (out / "acceptance.png").is_file()
    assert all(0 <= r["memory_rounds"] <= r["lookup_rounds"] for r in report["rows"])
    # the adapted row's decoder started from the pass's answer memory: the three train answers
    (memory,) = (out / "state").rglob("adapt/math/*/answer_memory.json")
    assert len(json.loads(memory.read_text())["sequences"]) == 3


def test_negative_adapt_prompts_is_refused(fake_bundled, capsys):
    assert main(["demo", "--pair", "tiny", "--backend", "torch", "--streams", "math", "--adapt-prompts", "-1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--adapt-prompts" in err[0]


def test_unknown_adapt_stream_is_refused(fake_bundled, capsys):
    assert main(["demo", "--pair", "tiny", "--backend", "torch", "--streams", "math", "--adapt-streams", "poetry"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--adapt-streams poetry" in err[0] and "code, math, text" in err[0]


def test_real_pairs_need_their_models_installed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path / "empty-cache"))
    assert main(["demo", "--quick"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "omnidraft models install qwen2.5-coder-0.5b-instruct" in err[0], err


def test_real_pairs_draft_with_the_drafter_that_learned_from_real_targets(fake_bundled, tokenizer_path, capsys):
    """The tiny pair's folders do not stand in for it: a missing one is named, with its fix, before
    any real target is looked up."""
    assert main(["demo", "--quick"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    missing = fake_bundled / bundled.REAL_DRAFTER / "config.json"
    assert len(err) == 1 and f"{missing} is missing" in err[0] and "--recipe drafter-teachers" in err[0], err
    make_tiny_model(fake_bundled / bundled.REAL_DRAFTER, "llama", tokenizer_path("llama-spm"), seed=3)
    assert set(bundled.check_bundled(roles=(bundled.REAL_DRAFTER,))) == {bundled.REAL_DRAFTER}


def test_streams_that_no_pair_covers_are_refused(fake_bundled, tmp_path, capsys):
    from omnidraft.bench.demo import DemoSettings, demo_pairs
    from omnidraft.errors import InvalidArgument

    pairs = demo_pairs(DemoSettings(pair="tiny", streams=("math",)))
    assert [p.streams for p in pairs] == [("math",)]
    with pytest.raises(InvalidArgument, match="selects no stream"):
        demo_pairs(DemoSettings(pair="tiny", streams=()))


def test_lockstep_rotates_the_order_and_keeps_each_configurations_outputs():
    from types import SimpleNamespace

    from omnidraft.bench.streams_eval import run_lockstep
    from omnidraft.runtime.decode_config import DecodeConfig
    from omnidraft.runtime.decode_stats import DecodeStats

    calls = []

    class Recorder:
        def generate(self, prompt, cfg):
            calls.append((prompt, cfg.mode))
            return SimpleNamespace(stats=DecodeStats(), token_ids=[len(prompt), len(cfg.mode)])

    cfgs = {"a": DecodeConfig(mode="target-only"), "b": DecodeConfig(mode="ngram")}
    runs = run_lockstep(Recorder(), ["x", "yy", "zzz"], cfgs, "test", progress=False)
    assert calls == [("x", "target-only"), ("x", "ngram"), ("yy", "ngram"), ("yy", "target-only")] + [
        ("zzz", "target-only"),
        ("zzz", "ngram"),
    ]
    assert runs["a"].outputs == [[1, 11], [2, 11], [3, 11]] and runs["b"].outputs == [[1, 5], [2, 5], [3, 5]]
    assert runs["a"].prompts == runs["b"].prompts == 3 and not runs["a"].interrupted
    # a configuration with its own decoder decodes through it alone
    calls.clear()
    mine = []

    class Own(Recorder):
        def generate(self, prompt, cfg):
            mine.append(prompt)
            return super().generate(prompt, cfg)

    run_lockstep(Recorder(), ["x", "yy"], cfgs, "test", progress=False, decoders={"a": Own()})
    assert mine == ["x", "yy"] and len(calls) == 4
