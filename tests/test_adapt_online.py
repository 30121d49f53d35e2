"""The online loop end to end on a tiny pair: CLI, report, per-target state, drift guard, greedy exactness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import make_tiny_model

from omnidraft.adapt import online
from omnidraft.adapt.config import AdaptConfig, PublishPolicy, StreamDecoding, UpdateSchedule
from omnidraft.adapt.guard import Measure
from omnidraft.adapt.online import OnlineAdapter
from omnidraft.cli import main
from omnidraft.runtime.decode_config import DecodeConfig

PROMPTS = [
    "def add(a, b):\n    return a + b\n\nprint(",
    "Question: Tom has 3 apples and buys 5 more.\nAnswer:",
    "To be, or not to be, that is the question:",
    "import os\nimport sys\n\n",
    "class Stack:\n    def push(self, x):",
    "The quick brown fox jumps over",
    "for i in range(10):\n    print(",
    "Once upon a time, in a land far away,",
]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tokenizer_path):
    root = tmp_path_factory.mktemp("tiny-adapt-online")
    d = make_tiny_model(root / "d", "llama", tokenizer_path("llama-spm"), seed=1)
    t = make_tiny_model(root / "t", "qwen2", tokenizer_path("gpt-2"), seed=2)
    stream = root / "stream.jsonl"
    stream.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS) + "\n")
    return d, t, stream


def _cfg(*, lr: float = 3e-2, draft_len: int = 4) -> AdaptConfig:
    return AdaptConfig(
        schedule=UpdateSchedule(every=4, engine="eager", lr=lr, rank=4),
        decoding=StreamDecoding(max_new_tokens=12, draft_len=draft_len),
        publish=PublishPolicy(every=1, guard_margin=1.0),
    )


def test_cli_run_writes_report_and_per_target_state(pair, tmp_path, capsys):
    d, t, stream = pair
    out = tmp_path / "out"
    rc = main(
        [
            "adapt",
            "--drafter",
            str(d),
            "--target",
            str(t),
            "--stream",
            str(stream),
            "--out",
            str(out),
            "--every",
            "4",
            "--max-new-tokens",
            "12",
            "--engine",
            "eager",
            "--lora-rank",
            "4",
            "--lr",
            "0.03",
            "--guard-margin",
            "1",
            "--json",
        ]
    )
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["stream_summary"]["prompts"] == len(PROMPTS) and rep["stream_summary"]["updates"] == 2
    assert len(rep["per_prompt"]["accepted"]) == len(PROMPTS)
    assert all(x["applied"] for x in rep["losses"]) and rep["stream_summary"]["dm_positions"] > 0
    for f in ("report.json", "report.md", "acceptance.png"):
        assert (out / f).stat().st_size > 0
    state = Path(rep["state"])
    assert state.parent == out / "state" and state.name == rep["target_id"]
    assert {p.name for p in state.iterdir()} == {"adapter", "drafter", "ngram_cache.json", "answer_memory.json"}
    # A second run on the same state resumes from the saved adapter.
    rc = main(
        [
            "adapt",
            "--drafter",
            str(d),
            "--target",
            str(t),
            "--stream",
            str(stream),
            "--out",
            str(out),
            "--every",
            "4",
            "--max-new-tokens",
            "12",
            "--engine",
            "eager",
            "--lora-rank",
            "4",
            "--train-limit",
            "4",
            "--json",
        ]
    )
    assert rc == 0 and json.loads(capsys.readouterr().out)["resumed_adapter"] is True


def test_bad_inputs_get_one_clear_line(pair, tmp_path, capsys):
    d, t, _ = pair
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "ok"}\n{"prompt": \n')
    common = ["--drafter", str(d), "--target", str(t), "--out", str(tmp_path / "o")]
    cases = [
        (["--stream", str(empty)], "empty"),
        (["--stream", str(broken)], "line 2"),
        (["--stream", "poetry"], "unknown stream"),
        (["--stream", str(broken), "--loss", "kl"], "--loss"),
        (["--stream", str(broken), "--divergence", "sideways"], "--divergence"),
        (["--stream", str(broken), "--every", "0"], "every"),
        (["--stream", str(broken), "--eval-draft-lens", "1,two"], "--eval-draft-lens"),
        (["--stream", str(broken), "--eval-draft-lens", "0,2"], "--eval-draft-lens"),
    ]
    for extra, needle in cases:
        assert main(["adapt", *common, *extra]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0] and "Traceback" not in err[0], err


def test_drift_guard_rolls_back_a_worse_delta(pair, tmp_path, monkeypatch):
    d, t, _ = pair
    ad = OnlineAdapter(d, t, tmp_path / "state", _cfg())
    initial = ad.trainer.snapshot()
    recs = [ad.decode(p) for p in PROMPTS[:4]]
    ad.update(recs)
    trained = ad.trainer.snapshot()
    assert any(not torch.equal(initial[n], trained[n]) for n in initial)
    calls = iter([0.10, 0.50])  # candidate, then previous

    def scripted(decoder, prompts, cfg, **kw):
        m = Measure(prompts=len(prompts), proposed=100)
        m.accepted = int(100 * next(calls))
        return m

    monkeypatch.setattr(online, "measure", scripted)
    ad.cfg.publish.guard_margin = 0.02
    assert ad.publish(PROMPTS[:4]) is False
    now = ad.trainer.snapshot()
    assert all(torch.equal(now[n], initial[n]) for n in now)  # rolled back to the published weights
    assert ad.log.events[-1]["action"] == "rolled-back"
    assert not (ad.dir / "adapter").exists()  # nothing written
    # A delta within the margin is published.
    ad.update(recs)
    calls = iter([0.49, 0.50])
    assert ad.publish(PROMPTS[:4]) is True
    assert ad.log.events[-1]["action"] == "published" and (ad.dir / "adapter").is_dir()


def test_greedy_output_after_adaptation_equals_target_only(pair, tmp_path):
    d, t, _ = pair
    ad = OnlineAdapter(d, t, tmp_path / "state", _cfg(lr=5e-2))
    start = ad.trainer.snapshot()
    ad.run(PROMPTS)
    assert any(not torch.equal(start[n], p) for n, p in ad.trainer.params.items())
    spec = ad.evaluate(PROMPTS, ad.published, ad._cache_copy())
    ref = online.measure(ad.decoder, PROMPTS, DecodeConfig(max_new_tokens=12, mode="target-only"))
    assert spec.proposed > 0 and len(spec.outputs) == len(PROMPTS)
    assert spec.outputs == ref.outputs


def test_eval_per_draft_len_matches_the_run_eval(pair, tmp_path, monkeypatch):
    """The per-K table re-measures the same weights and caches: at the run's own K it must reproduce
    the before/after figures, and the markdown report carries one row per K."""
    from omnidraft.adapt import run as run_mod

    d, t, stream = pair
    real = run_mod.load_prompts
    monkeypatch.setattr(
        run_mod,
        "load_prompts",
        lambda s, split, limit, **kw: PROMPTS[:3] if split == "test" else real(s, split, limit, **kw),
    )
    rep = run_mod.adapt_stream(
        d,
        t,
        str(stream),
        tmp_path / "out",
        _cfg(draft_len=2),
        eval_split="test",
        greedy_check=0,
        progress=False,
        eval_draft_lens=(1, 2),
    )
    ev = rep["eval"]
    assert set(ev["by_draft_len"]) == {"1", "2"}
    for key in ("before", "cache_only", "after"):
        assert ev["by_draft_len"]["2"][key]["acceptance"] == ev[key]["acceptance"]
        assert ev["by_draft_len"]["1"][key]["prompts"] == 3
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| K | base, fresh cache" in md and md.count("\n| 1 |") == 1 and md.count("\n| 2 |") == 1
