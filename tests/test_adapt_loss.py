"""Hybrid distillation loss and on-policy buffer: hand computations and alignment properties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import make_tiny_model

from omnidraft.adapt.buffer import Collector, Record, compact_target
from omnidraft.adapt.loss import LAMBDA, SPLIT_LAMBDA, hybrid_loss, make_batch
from omnidraft.adapt.trainer import Trainer, wrap_lora
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.session import open_pair


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def test_loss_matches_hand_computation():
    rng = np.random.default_rng(0)
    V, L = 7, 4
    inter = np.array([0, 2, 3, 5, 6])  # drafter ids in the intersection
    logits = rng.normal(size=(1, L, V)) * 2
    p_full = [_softmax(rng.normal(size=len(inter)) * 3) for _ in range(L)]
    k = 2
    dm_rows, ng_rows, ng_labels = [0, 2], [1, 3], [4, 1]
    # Compact target: top-2 + tail for each DM row.
    idx = np.zeros((1, L, k), dtype=np.int64)
    logp = np.zeros((1, L, k))
    tail = np.zeros((1, L))
    for r in dm_rows:
        top = np.argsort(-p_full[r])[:k]
        idx[0, r], logp[0, r] = top, np.log(p_full[r][top])
        tail[0, r] = np.log((1 - p_full[r][top].sum()) / (len(inter) - k))
    # By hand: q' = softmax over the intersection columns; p = top-k as given, the rest uniform tail.
    expected = 0.0
    for r in dm_rows:
        q = _softmax(logits[0, r, inter])
        p = np.full(len(inter), np.exp(tail[0, r]))
        p[idx[0, r]] = np.exp(logp[0, r])
        expected += np.sum(q * (np.log(q) - np.log(p)))
    for r, lab in zip(ng_rows, ng_labels):
        expected += LAMBDA * -np.log(_softmax(logits[0, r])[lab])
    expected /= len(dm_rows) + len(ng_rows)
    dm = torch.zeros(1, L)
    dm[0, dm_rows] = 1
    ng = torch.zeros(1, L)
    ng[0, ng_rows] = 1
    labels = torch.zeros(1, L, dtype=torch.long)
    labels[0, ng_rows] = torch.tensor(ng_labels)
    args = (
        torch.tensor(logits, dtype=torch.float64),
        torch.tensor(inter),
        dm,
        torch.tensor(idx),
        torch.tensor(logp),
        torch.tensor(tail),
        ng,
        labels,
    )
    got = hybrid_loss(*args, torch.tensor([LAMBDA], dtype=torch.float64))
    assert got.item() == pytest.approx(expected, rel=1e-9)
    # dm variant: no n-gram term, and n-gram positions left out of the average.
    kl = sum(
        np.sum(
            _softmax(logits[0, r, inter])
            * (
                np.log(_softmax(logits[0, r, inter]))
                - np.log(
                    np.where(np.isin(np.arange(len(inter)), idx[0, r]), 0, np.exp(tail[0, r]))
                    + np.bincount(idx[0, r], np.exp(logp[0, r]), len(inter))
                )
            )
        )
        for r in dm_rows
    ) / len(dm_rows)
    got_dm = hybrid_loss(*args[:6], torch.zeros(1, L), labels, torch.tensor([0.0]))
    assert got_dm.item() == pytest.approx(kl, rel=1e-9)


def test_reverse_kl_is_zero_when_drafter_equals_target_on_intersection():
    V = 6
    inter = torch.tensor([1, 2, 4, 5])
    logits = torch.randn(1, 1, V, dtype=torch.float64)
    q = torch.softmax(logits[0, 0, inter], -1)
    idx = torch.arange(4).view(1, 1, 4)
    loss = hybrid_loss(
        logits,
        inter,
        torch.ones(1, 1),
        idx,
        q.log().view(1, 1, 4),
        torch.zeros(1, 1),
        torch.zeros(1, 1),
        torch.zeros(1, 1, dtype=torch.long),
        torch.tensor([LAMBDA]),
    )
    assert abs(loss.item()) < 1e-12
    # and positive for any other target distribution
    other = torch.softmax(torch.randn(4, dtype=torch.float64), -1)
    loss2 = hybrid_loss(
        logits,
        inter,
        torch.ones(1, 1),
        idx,
        other.log().view(1, 1, 4),
        torch.zeros(1, 1),
        torch.zeros(1, 1),
        torch.zeros(1, 1, dtype=torch.long),
        torch.tensor([LAMBDA]),
    )
    assert loss2.item() > 1e-6


class _Vocab:
    def __init__(self, n):
        self.target_ids = np.arange(n)
        self.size = n


def test_compact_target_topk_and_tail():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=20) * 4
    top, logp, tail, mass = compact_target(logits, _Vocab(20), k=5)
    p = _softmax(logits)
    want = np.argsort(-p)[:5]
    assert list(top) == list(want)
    assert np.allclose(logp, np.log(p[want]))
    assert mass == pytest.approx(p[want].sum())
    assert tail == pytest.approx(np.log((1 - p[want].sum()) / 15))
    top, logp, tail, mass = compact_target(logits, _Vocab(20), k=64)  # k >= n: exact, no tail
    assert len(top) == 20 and tail == 0.0 and mass == pytest.approx(1.0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tokenizer_path):
    root = tmp_path_factory.mktemp("tiny-adapt-loss")
    d = make_tiny_model(root / "d", "llama", tokenizer_path("llama-spm"), seed=1)
    t = make_tiny_model(root / "t", "qwen2", tokenizer_path("gpt-2"), seed=2)
    return d, t


PROMPTS = [
    "def add(a, b):\n    return a + b\n\nprint(",
    "Question: Tom has 3 apples and buys 5 more.\nAnswer:",
    "To be, or not to be, that is the question:",
    "Ünïcödé àccents: café, naïve 🙂",
]


def test_buffer_positions_align_with_target_tokens(pair):
    d, t = pair
    dec = open_pair(t, d)
    col = Collector(dec.drafter.codec, dec.target.codec, dec.vocab, k=8, token_probs=True)
    dc, tc, vocab = dec.drafter.codec, dec.target.codec, dec.vocab
    n_dm = n_ng = 0
    for prompt in PROMPTS:
        col.start(prompt)
        probs = []  # the target's own p (T = 1) of each verified token: the dynamic lambda of its n-gram rows

        def on_verified(tokens, rows):
            probs.extend(_softmax(r.astype(np.float64))[t] for t, r in zip(tokens, rows))
            col.on_verified(tokens, rows)

        res = dec.generate(prompt, DecodeConfig(max_new_tokens=24), on_verified=on_verified)
        rec = col.finish(res.stats.accepted, res.stats.proposed)
        assert rec.target_tokens == len(res.token_ids) == len(probs)
        assert rec.ng_prob.shape == rec.ng_rows.shape
        # Target token byte spans, after the prompt.
        spans, prob_at, pos = {}, {}, len(prompt.encode())
        for tid, pt in zip(res.token_ids, probs):
            b = tc.spell([tid])
            spans[pos] = (tid, pos + len(b))
            prob_at[pos] = pt
            pos += len(b)
        text = prompt.encode() + tc.spell(res.token_ids)
        # The rebuilt drafter context spells the text (SentencePiece may add one leading space).
        body = rec.ids[len(dc.start_ids) :].tolist()
        sp = dc.spell(body)
        virtual = 0 if text.startswith(sp) else 1
        assert sp[:virtual] in (b"", b" ") and text.startswith(sp[virtual:])
        starts = np.concatenate([[0], np.cumsum([len(dc.token_bytes[i]) for i in body])]) - virtual
        starts = np.maximum(starts, 0)
        off = len(dc.start_ids)

        def span(j):  # byte span of drafter token ids[j]
            return int(starts[j - off]), int(starts[j - off + 1])

        for r in rec.dm_rows:
            a, b = span(r + 1)
            tid, end = spans[a]
            assert end == b and int(vocab.d2t[rec.ids[r + 1]]) == tid
        rows = rec.ng_rows.tolist()
        for r, pt in zip(rows, rec.ng_prob):  # each row carries p of the target token it starts or continues
            a = span(r + 1)[0]
            while a not in spans:
                a -= 1
            assert pt == pytest.approx(prob_at[a], rel=1e-5)
        while rows:  # consecutive rows spell exactly one target token, or one row a whole split
            a, b = span(rows[0] + 1)
            tid, end = spans[a]
            split = bool(rec.ng_split[len(rec.ng_rows) - len(rows)])
            assert split == (b > end)
            if b > end:  # a split: one drafter token the target spelled with several tokens
                assert int(rec.ids[rows[0] + 1]) in vocab.splits
                while end < b:
                    end = spans[end][1]
                assert end == b
                rows = rows[1:]
                continue
            n = 1
            while b < end:
                assert rows[n] == rows[n - 1] + 1
                b = span(rows[n] + 1)[1]
                n += 1
            assert b == end and n > 1  # a lone unmapped token (byte-fallback "\\n") is no n-gram
            first = len(rec.ng_rows) - len(rows)
            assert not rec.ng_split[first : first + n].any()
            rows = rows[n:]
        assert rec.dm_logp.dtype == np.float16 and rec.dm_idx.shape == (len(rec.dm_rows), 8)
        n_dm += len(rec.dm_rows)
        n_ng += len(rec.ng_rows)
    assert n_dm > 0 and n_ng > 0


def test_nan_loss_skips_update_and_keeps_weights(pair):
    d, t = pair
    dec = open_pair(t, d)
    model = wrap_lora(dec.drafter.backend.model, 4)
    col = Collector(dec.drafter.codec, dec.target.codec, dec.vocab, k=8)
    recs = []
    for prompt in PROMPTS[:2]:
        col.start(prompt)
        dec.generate(prompt, DecodeConfig(max_new_tokens=16), on_verified=col.on_verified)
        recs.append(col.finish())
    tr = Trainer(model, dec.vocab.drafter_ids, loss="hybrid", engine="eager", k=8, lr=1e-2)
    before = tr.snapshot()
    bad = Record(**{**recs[0].__dict__, "dm_logp": np.full_like(recs[0].dm_logp, np.nan)})
    res = tr.step([bad, recs[1]], update=7)
    assert not res.applied and res.reason == "non-finite"
    after = tr.snapshot()
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert tr.events and tr.events[-1]["event"] == "skipped-update" and tr.events[-1]["update"] == 7
    res = tr.step(recs, update=8)  # a finite batch afterwards does update
    assert res.applied
    assert any(not torch.equal(before[n], p) for n, p in tr.params.items())


def test_make_batch_truncates_from_the_left_keeping_rows_aligned():
    ids = np.arange(10, 30, dtype=np.int32)
    rec = Record(
        prompt="x",
        ids=ids,
        dm_rows=np.array([3, 15], dtype=np.int32),
        dm_idx=np.array([[1, 2], [3, 4]], dtype=np.uint16),
        dm_logp=np.zeros((2, 2), dtype=np.float16),
        dm_tail=np.zeros(2, dtype=np.float32),
        ng_rows=np.array([16, 17], dtype=np.int32),
    )
    b = make_batch([rec], "hybrid", k=2, batch_size=2, seq_len=8)
    assert b.ids.shape == (2, 8) and b.ids[0].tolist() == list(range(22, 30))
    # row 15 -> 15 - 12 = 3; row 3 fell off the left edge
    assert b.dm_mask[0].nonzero().flatten().tolist() == [3]
    assert b.topk_idx[0, 3].tolist() == [3, 4]
    assert b.ng_mask[0].nonzero().flatten().tolist() == [4, 5]
    assert b.labels[0, 4].item() == ids[17] and b.labels[0, 5].item() == ids[18]
    assert b.dm_mask[1].sum() == 0
    dm = make_batch([rec], "dm", k=2)
    assert dm.ng_mask.sum() == 0 and dm.lam.item() == 0.0
    # a split row's NLL weighs SPLIT_LAMBDA, an n-gram row's LAMBDA (both through lam = LAMBDA)
    rec.ng_split = np.array([True, False])
    sp = make_batch([rec], "hybrid", k=2, batch_size=2, seq_len=8)
    assert sp.ng_mask[0, 4].item() * sp.lam.item() == pytest.approx(SPLIT_LAMBDA)
    assert sp.ng_mask[0, 5].item() * sp.lam.item() == pytest.approx(LAMBDA)
    rec.ng_split = None
    # dynamic lambda: each n-gram row weighted by the target's p of its token, lam 1
    rec.ng_prob = np.array([0.25, 0.5], dtype=np.float32)
    dyn = make_batch([rec], "hybrid-dynamic", k=2, batch_size=2, seq_len=8)
    assert dyn.ng_mask[0, 4].item() == 0.25 and dyn.ng_mask[0, 5].item() == 0.5 and dyn.lam.item() == 1.0
    assert torch.equal(dyn.labels, b.labels) and torch.equal(dyn.dm_mask, b.dm_mask)
    rec.ng_prob = None
    with pytest.raises(ValueError, match="ng_prob"):
        make_batch([rec], "hybrid-dynamic", k=2)
