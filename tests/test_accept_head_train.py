"""Online training of the acceptance head (joint / interleaved, with and without distillation) on a
tiny cross-vocabulary pair, the soft-label BCE itself, and bad inputs through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_models import make_tiny_model

from omnidraft.adapt.config import (
    AdaptConfig,
    Distillation,
    HeadTraining,
    PublishPolicy,
    StreamDecoding,
    UpdateSchedule,
)
from omnidraft.adapt.head import HeadRecord, HeadTrainer, calibration, head_loss, labels
from omnidraft.adapt.online import OnlineAdapter
from omnidraft.cli import main
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.draft_length.head_file import drafter_identity, read_head
from omnidraft.runtime.draft_length.head_model import AcceptHead
from omnidraft.runtime.loader import load_model
from omnidraft.runtime.speculative import SpeculativeDecoder

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
    root = tmp_path_factory.mktemp("tiny-head-train")
    d = make_tiny_model(root / "d", "llama", tokenizer_path("llama-spm"), seed=1)
    t = make_tiny_model(root / "t", "qwen2", tokenizer_path("gpt-2"), seed=2)
    stream = root / "stream.jsonl"
    stream.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS) + "\n")
    return d, t, stream


def _synthetic(n_targets: int, seed: int, soft: bool) -> HeadRecord:
    """Target tokens of 1-3 drafter tokens whose acceptance follows a hidden linear rule."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 4, (n_targets,), generator=g)
    group = torch.repeat_interleave(torch.arange(n_targets), sizes)
    feats = torch.randn(len(group), 16, generator=g)
    w = torch.randn(16, generator=torch.Generator().manual_seed(123))  # the same rule for every set
    log_tok = torch.nn.functional.logsigmoid(feats @ w + 1.0)
    p = torch.zeros(n_targets).index_add(0, group, log_tok).exp()
    lab = p if soft else (torch.rand(n_targets, generator=g) < p).float()
    return HeadRecord(
        feats,
        torch.zeros(len(group), dtype=torch.long),
        group,
        lab,
        lab.numpy().astype(np.float32),
        np.full(n_targets, np.nan, np.float32),
    )


@pytest.mark.parametrize("soft", [True, False])
def test_bce_on_target_space_labels_decreases(soft):
    torch.manual_seed(0)
    train, held = _synthetic(400, 0, soft), _synthetic(200, 1, soft)
    head = AcceptHead(16, 2)
    tr = HeadTrainer(head, "joint", lr=3e-3, steps=1)

    def held_loss() -> float:
        with torch.no_grad():
            return float(head_loss(head, held.feats, held.group, held.size, labels(held, None, 0.0)))

    before = held_loss()
    for _ in range(150):
        tr.step([train])
    after = held_loss()
    assert after < before - 0.05, (before, after)
    assert len(tr.losses) == 150 and tr.losses[-1]["loss"] < tr.losses[0]["loss"]


def test_token_biases_learn_which_drafted_tokens_the_target_rejects():
    """Acceptance that depends on the drafted token alone (as a cross-vocabulary mapping makes it)
    is invisible to the hidden-state MLP here (noise features) and learned by the per-token biases:
    held-out loss drops well below the MLP-only head's, and the biases rank the tokens."""
    rate = torch.linspace(0.1, 0.95, 8)
    torch.manual_seed(0)

    def batch(n: int, seed: int) -> HeadRecord:
        g = torch.Generator().manual_seed(seed)
        tok = torch.randint(0, 8, (n,), generator=g)
        obs = (torch.rand(n, generator=g) < rate[tok]).float()
        return HeadRecord(
            torch.randn(n, 16, generator=g), tok, torch.arange(n), obs, obs.numpy(), np.full(n, np.nan, np.float32)
        )

    held = batch(2000, 99)

    def held_loss(head: AcceptHead) -> float:
        with torch.no_grad():
            return float(head_loss(head, held.feats, held.group, held.size, held.p_target, tokens=held.tokens))

    losses = {}
    for vocab in (0, 8):
        head = AcceptHead(16, 2, vocab_size=vocab)
        tr = HeadTrainer(head, "joint", steps=8)
        for u in range(6):  # a short stream: six updates of 8 steps, as the bench's 48 prompts give
            tr.on_update([batch(150, u)], u)
        losses[vocab] = held_loss(head)
    assert losses[8] < losses[0] - 0.05, losses
    b = head.token_bias.detach()
    assert float(np.corrcoef(b.numpy(), rate.numpy())[0, 1]) > 0.9, b


def test_replayed_batches_step_only_what_does_not_read_the_features():
    """Interleaved replay: the features were recorded by older drafters, so a replayed step moves
    the per-token biases and the output bias and leaves the hidden-state MLP as it was."""
    rec = _synthetic(200, 4, soft=False)
    head = AcceptHead(16, 2, vocab_size=4)
    tr = HeadTrainer(head, "interleaved", steps=3)
    tr.on_update([rec], 1)  # a fresh batch: everything moves
    before = {n: p.detach().clone() for n, p in head.named_parameters()}
    tr.after_prompt(None, 9)  # a replayed batch
    moved = {n for n, p in head.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {"token_bias", "out.bias"}, moved
    assert [x.get("update", x.get("prompt")) for x in tr.losses if "loss" in x] == [1, 9]


def test_soft_label_uses_the_merged_product():
    """min(1, p(t)/q'(t)) with q' = prod of the sub-token probabilities (current lm_head)."""
    lm = torch.nn.Linear(4, 3, bias=False)
    with torch.no_grad():
        lm.weight.copy_(torch.eye(3, 4) * 5)
    feats = torch.eye(4)[:3]
    rec = HeadRecord(
        feats,
        torch.tensor([0, 1, 2]),
        torch.tensor([0, 0, 1]),
        torch.tensor([0.2, 0.9]),
        np.zeros(2, np.float32),
        np.zeros(2, np.float32),
    )
    q = torch.softmax(lm(feats), -1).detach()
    lab = labels(rec, lm, 1.0)
    assert lab[0] == pytest.approx(min(1.0, 0.2 / float(q[0, 0] * q[1, 1])), rel=1e-5)
    assert lab[1] == pytest.approx(min(1.0, 0.9 / float(q[2, 2])), rel=1e-5)
    assert labels(rec, lm, 0.0).tolist() == pytest.approx([0.2, 0.9])


def test_calibration_bins():
    pred = np.array([0.05, 0.15, 0.12, 0.95, np.nan], np.float32)
    obs = np.array([0, 1, 0, 1, 1], np.float32)
    cal = calibration(pred, obs)
    assert [c["count"] for c in cal] == [1, 2, 1] and cal[1]["observed"] == 0.5


def _cfg(*, variant: str, loss: str) -> AdaptConfig:
    return AdaptConfig(
        schedule=UpdateSchedule(every=4, engine="eager", lr=3e-2, rank=4),
        distill=Distillation(loss=loss),
        decoding=StreamDecoding(max_new_tokens=12, draft_len="auto", gamma=0.6, max_draft_len=6),
        head=HeadTraining(train=True, variant=variant, replay=8, batch=2),
        publish=PublishPolicy(every=1, guard_margin=1.0),
    )


@pytest.mark.parametrize("variant,loss", [("joint", "hybrid"), ("interleaved", "none")])
def test_online_head_training(pair, tmp_path, variant, loss):
    d, t, _ = pair
    ad = OnlineAdapter(d, t, tmp_path / "state", _cfg(variant=variant, loss=loss))
    before = {n: p.detach().clone() for n, p in ad.head.head.named_parameters()}
    log = ad.run(PROMPTS)
    assert len(log.head_observed) > 0 and len(log.head_observed) == len(log.head_predicted)
    assert np.isfinite(np.asarray(log.head_predicted)).all()  # auto mode: every observed token was predicted
    assert ad.head.losses[0]["warm_start"] and ad.head.warm  # bias set from the first prompt's labels
    kinds = {"update" if "update" in x else "prompt" for x in ad.head.losses if "loss" in x}
    assert kinds == ({"update"} if variant == "joint" else {"update", "prompt"})
    assert any(not torch.equal(p, before[n]) for n, p in ad.head.head.named_parameters())
    # the head is published beside the merged drafter, tied to it, and loading that folder attaches it
    merged = ad.dir / "drafter"
    info = read_head(merged)
    assert info.drafter == drafter_identity(merged) and info.training["variant"] == variant
    if loss == "none":  # drafter frozen: the merged weights are the base ones
        assert info.drafter.weights_sha256 == drafter_identity(d).weights_sha256
    drf, tgt = load_model(merged), load_model(t)
    assert drf.backend.has_accept_head
    dec = SpeculativeDecoder(tgt, drf)
    for prompt in PROMPTS[:3]:
        ref = dec.generate(prompt, DecodeConfig(max_new_tokens=12, mode="target-only"))
        out = dec.generate(prompt, DecodeConfig(max_new_tokens=12, draft_len="auto", gamma=0.5))
        assert out.token_ids == ref.token_ids


def test_cli_adapt_trains_a_head_and_writes_calibration(pair, tmp_path, capsys):
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
            "10",
            "--engine",
            "eager",
            "--lora-rank",
            "4",
            "--loss",
            "none",
            "--train-head",
            "--draft-len",
            "auto",
            "--gamma",
            "0.4",
            "--head-variant",
            "interleaved",
            "--json",
        ]
    )
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["head"]["variant"] == "interleaved" and rep["head"]["observed_target_tokens"] > 0
    assert (out / "calibration.png").stat().st_size > 0 and rep["head"]["calibration"]


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--gamma", "1.5", "--draft-len", "auto"], "--gamma must be within (0, 1)"),
        (["--gamma", "0", "--draft-len", "auto"], "--gamma must be within (0, 1)"),
        (["--draft-len", "auto", "--max-draft-len", "0"], "K_max) must be >= 1"),
        (["--draft-len", "lots"], "positive integer K or 'auto'"),
        (
            ["--draft-len", "auto"],
            "export the drafter with --accept-head HEAD, or train one with omnidraft adapt --train-head",
        ),
    ],
)
def test_cli_generate_bad_inputs(pair, capsys, argv, needle):
    d, t, _ = pair
    rc = main(
        ["generate", "--drafter", str(d), "--target", str(t), "--prompt", "hello", "--max-new-tokens", "4", *argv]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and needle in err[0], err


def test_cli_generate_refuses_a_head_of_another_drafter(pair, tmp_path, capsys):
    from omnidraft.runtime.draft_length.head_model import save_head

    d, t, _ = pair
    other = make_tiny_model(tmp_path / "other", "llama", d, seed=9)
    head = save_head(AcceptHead(32), tmp_path / "head", drafter_identity(other))
    rc = main(
        [
            "generate",
            "--drafter",
            str(d),
            "--target",
            str(t),
            "--prompt",
            "hello",
            "--max-new-tokens",
            "4",
            "--draft-len",
            "auto",
            "--accept-head",
            str(head),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "belongs to another drafter" in err[0]
    rc = main(
        [
            "adapt",
            "--drafter",
            str(d),
            "--target",
            str(t),
            "--stream",
            "x.jsonl",
            "--out",
            str(tmp_path / "o"),
            "--loss",
            "none",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "--train-head" in err[0]


def test_bad_head_options_fail_before_any_model_loads(capsys):
    for extra, needle in (
        (["--head-variant", "both"], "unknown --head-variant"),
        (["--head-steps", "0"], "--head-steps"),
        (["--head-lr", "-1"], "--head-lr"),
    ):
        rc = main(
            [
                "adapt",
                "--drafter",
                "/nonexistent",
                "--target",
                "/nonexistent",
                "--stream",
                "math",
                "--out",
                "/tmp/x",
                "--train-head",
                *extra,
            ]
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and len(err) == 1 and needle in err[0], err


def test_warm_start_matches_the_mean_acceptance():
    rec = _synthetic(300, 2, soft=False)
    head = AcceptHead(16, 1)
    tr = HeadTrainer(head)
    tr.warm_start(rec)
    with torch.no_grad():
        p = torch.zeros(rec.size).index_add(0, rec.group, torch.nn.functional.logsigmoid(head(rec.feats))).exp()
    assert float(p.mean()) == pytest.approx(float(rec.p_target.mean()), abs=0.08)
    bias = float(head.out.bias)
    tr.warm_start(_synthetic(50, 3, soft=False))  # only once
    assert float(head.out.bias) == bias
