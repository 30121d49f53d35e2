"""Adaptive drafting: the head's files and identity, the stopping rule, the loop with
``--draft-len auto`` on the torch and ORT backends (greedy output identical to target-only), and the
ONNX export with the head inside the graph."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import ScriptedDrafter, make_tiny_model

from omnidraft.errors import InvalidArgument
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.draft_length.head_file import AcceptHeadError, drafter_identity, read_head
from omnidraft.runtime.draft_length.head_model import AcceptHead, load_head, save_head
from omnidraft.runtime.draft_length.policy import (
    log_sigmoid,
    may_stop,
    parse_draft_len,
    rejection_prob,
    validate_adaptive,
)
from omnidraft.runtime.loader import LoadedModel, load_model
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import SpeculativeDecoder

PROMPTS = [
    "def add(a, b):\n    return a + b\n\nprint(",
    "Question: Tom has 3 apples and buys 5 more.\nAnswer:",
    "To be, or not to be, that is the question:",
    "日本語のテキスト 🙂 café",
]


def random_head(hidden: int, seed: int = 0, vocab_size: int = 0) -> AcceptHead:
    """A head whose predictions vary from token to token (the fresh init is nearly constant); with
    ``vocab_size``, every third token gets a bias (the others keep 0, as untrained tokens do)."""
    torch.manual_seed(seed)
    head = AcceptHead(hidden, vocab_size=vocab_size)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0.0, 0.3)
        head.out.bias.fill_(1.0)
        if vocab_size:
            head.token_bias.zero_()
            head.token_bias[::3] = torch.randn(len(head.token_bias[::3]))
    return head.eval()


def _vocab(folder) -> int:
    return int(json.loads((Path(folder) / "config.json").read_text())["vocab_size"])


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tokenizer_path):
    root = tmp_path_factory.mktemp("accept-head")
    d = make_tiny_model(root / "d", "llama", tokenizer_path("llama-spm"), seed=1, max_pos=256)
    t = make_tiny_model(root / "t", "qwen2", tokenizer_path("gpt-2"), seed=2, max_pos=256)
    head_dir = save_head(
        random_head(32, vocab_size=_vocab(d)), root / "head", drafter_identity(d), {"note": "random test head"}
    )
    return d, t, head_dir, root


# -- the stopping rule ---------------------------------------------------------------------------------


def test_rejection_probability_is_one_minus_the_product():
    a = [0.9, 0.8, 0.5]
    logit = [math.log(p / (1 - p)) for p in a]
    s = sum(log_sigmoid(z) for z in logit)
    assert rejection_prob(s) == pytest.approx(1 - 0.9 * 0.8 * 0.5)
    assert log_sigmoid(-800.0) == pytest.approx(-800.0) and log_sigmoid(800.0) == 0.0  # no overflow
    # gamma boundary: strictly greater stops
    assert not rejection_prob(math.log(0.5)) > 0.5
    assert rejection_prob(math.log(0.5) - 1e-9) > 0.5


def test_may_stop_only_at_clean_target_boundaries():
    assert may_stop([(0, 1), (1, 3)], 3, 3)  # the draft ends on a target token
    assert not may_stop([(0, 1)], 2, 3)  # one trailing sub-token could still merge
    assert may_stop([(0, 1)], 4, 3)  # a tail as long as the longest n-gram cannot
    assert not may_stop([], 1, 2) and may_stop([], 1, 1)


def test_validation():
    validate_adaptive("auto", 0.5, 16)
    validate_adaptive(3, 0.01, 1)
    for bad in [
        ("auto", 0.0, 16),
        ("auto", 1.0, 16),
        ("auto", -0.2, 16),
        ("auto", 0.5, 0),
        (0, 0.5, 16),
        ("fast", 0.5, 16),
    ]:
        with pytest.raises(InvalidArgument):
            validate_adaptive(*bad)
    assert parse_draft_len("auto") == "auto" and parse_draft_len("AUTO") == "auto" and parse_draft_len("5") == 5
    with pytest.raises(InvalidArgument, match="positive integer K or 'auto'"):
        parse_draft_len("many")
    cfg = DecodeConfig(draft_len="auto", max_draft_len=7)
    assert cfg.adaptive and cfg.k_max == 7 and DecodeConfig(draft_len=3).k_max == 3
    with pytest.raises(InvalidArgument, match="gamma"):
        DecodeConfig(draft_len="auto", gamma=1.5).validate()


class _HeadedScript(ScriptedDrafter):
    """A scripted drafter whose acceptance head returns a fixed probability per drafted position."""

    has_accept_head = True

    def __init__(self, script, vocab_size, probs, biases=None) -> None:
        super().__init__(script, vocab_size)
        self.probs, self.calls, self.biases = probs, 0, biases or {}

    def accept_bias(self, token):
        return self.biases.get(token, 0.0)

    def forward_with_accept(self, ids, start):
        logits = self.forward(ids, start)
        p = self.probs[min(self.calls, len(self.probs) - 1)]
        self.calls += 1
        return logits, np.full(len(ids), math.log(p / (1 - p)), dtype=np.float32)


def _scripted(pair, probs, text=" the cat sat on the mat and the dog sat on the log", cache=False, biases=None):
    d, t, _, _ = pair
    tgt, drf = load_model(t), load_model(d)
    prompt = "Once upon a time"
    ids = list(drf.codec.start_ids) + drf.codec.encode(prompt + text)
    fake = _HeadedScript(ids, drf.backend.vocab_size, probs, biases)
    ngrams = NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size) if cache else None
    dec = SpeculativeDecoder(tgt, LoadedModel(fake, drf.codec, drf.eos_ids, drf.path, "scripted"), ngrams)
    return dec, prompt, fake


def test_loop_stops_when_the_product_passes_gamma(pair):
    # P(accept) 0.9 per token: 1 - 0.9^k > 0.5 first at k = 7; > 0.2 at k = 3.
    for gamma, k in ((0.5, 7), (0.2, 3), (0.95, 16)):
        dec, prompt, fake = _scripted(pair, [0.9])
        out = dec.generate(prompt, DecodeConfig(max_new_tokens=8, draft_len="auto", gamma=gamma, mode="dm"), trace=True)
        assert len(out.rounds[0].draft) == k
        assert out.stats.drafter_calls >= k
    dec, prompt, fake = _scripted(pair, [0.9])
    out = dec.generate(
        prompt, DecodeConfig(max_new_tokens=8, draft_len="auto", gamma=0.5, max_draft_len=4, mode="dm"), trace=True
    )
    assert len(out.rounds[0].draft) == 4  # K_max bounds it
    dec, prompt, _ = _scripted(pair, [0.01])
    out = dec.generate(prompt, DecodeConfig(max_new_tokens=8, draft_len="auto", gamma=0.99, mode="dm"), trace=True)
    assert len(out.rounds[0].draft) == 1  # K >= 1 even when the first token is hopeless


def test_loop_adds_the_drafted_tokens_bias(pair):
    """The head's logit comes from the row before the token is known; the drafted token's bias is
    added once it is chosen, so one hopeless token stops the draft right there."""
    d, _, _, _ = pair
    codec = load_model(d).codec
    third = codec.encode("Once upon a time the cat sat")[-1]  # the draft is " the", " cat", " sat", ...
    dec, prompt, _ = _scripted(pair, [0.9], biases={third: -12.0})
    out = dec.generate(prompt, DecodeConfig(max_new_tokens=8, draft_len="auto", gamma=0.5, mode="dm"), trace=True)
    r = out.rounds[0]
    assert r.draft[2] == third and len(r.draft) == 3
    assert r.accept_logits[2] == pytest.approx(math.log(0.9 / 0.1) - 12.0, abs=1e-5)
    assert r.accept_logits[0] == pytest.approx(math.log(0.9 / 0.1), abs=1e-5)
    # The online offsets (runtime/draft_length/calibration.py, via the gamma controller) act the same way.
    dec, prompt, _ = _scripted(pair, [0.9])
    out = dec.generate(
        prompt,
        DecodeConfig(max_new_tokens=8, draft_len="auto", gamma=0.5, mode="dm", accept_offsets={third: -12.0}),
        trace=True,
    )
    assert len(out.rounds[0].draft) == 3


def test_loop_does_not_stop_inside_a_merged_ngram(pair):
    """Draft ' the', '\n', '\n', 'end' where ('\n', '\n') is a cached n-gram for GPT-2's '\n\n' and
    '\n' alone has no target counterpart. P(accept) = 0.6 per drafter token, gamma 0.5: the rule
    fires after 2 tokens (1 - 0.36), but ' the' + half an n-gram does not translate cleanly, so the
    loop drafts the 3rd token, which closes the n-gram: one merged target token of acceptance 0.36."""
    dec, prompt, fake = _scripted(pair, [0.6], text=" the\n\nend of it", cache=True)
    nl = fake.script[len(fake.script) - 5]
    assert dec.drafter.codec.spell([nl]) == b"\n" and dec.vocab.d2t[nl] < 0
    nn = dec.target.codec.encode("\n\n")
    assert len(nn) == 1
    dec.cache.observe((nl, nl), nn[0])
    out = dec.generate(prompt, DecodeConfig(max_new_tokens=8, draft_len="auto", gamma=0.5), trace=True)
    r = out.rounds[0]
    assert len(r.draft) == 3 and r.spans == [(0, 1), (1, 3)] and r.merged == [False, True]
    # Without the n-gram the '\n' could never be proposed: a tail as long as the longest n-gram stops it.
    dec, prompt, fake = _scripted(pair, [0.9], text=" the\n\nend of it", cache=True)
    dec.cache.observe((nl, nl), nn[0])
    out = dec.generate(prompt, DecodeConfig(max_new_tokens=8, draft_len="auto", gamma=0.5), trace=True)
    assert out.rounds[0].spans[-1][1] == len(out.rounds[0].draft)


# -- head files and identity ---------------------------------------------------------------------------


def test_head_roundtrip_and_identity(pair, tmp_path):
    d, _, head_dir, root = pair
    head, info = load_head(head_dir, drafter_identity(d))
    assert info.hidden_size == 32 and info.training == {"note": "random test head"}
    x = torch.randn(5, 32)
    ref = random_head(32, vocab_size=_vocab(d))
    torch.testing.assert_close(head(x), ref(x))
    torch.testing.assert_close(head.token_bias, ref.token_bias)
    tok = torch.tensor([0, 3, 4, 5])
    torch.testing.assert_close(head.logits(x[:4], tok), ref(x[:4]) + ref.token_bias[tok])
    assert head.bias_of(4) == 0.0 and head.bias_of(3) == float(ref.token_bias[3]) != 0.0
    assert set(head.sparse_token_bias()) == {str(i) for i in range(0, _vocab(d), 3) if ref.token_bias[i] != 0}
    other = make_tiny_model(root / "d-other", "llama", d, seed=7, max_pos=256)
    with pytest.raises(AcceptHeadError, match="belongs to another drafter.*train a head for this drafter") as e:
        load_model(other, accept_head=head_dir)
    assert drafter_identity(d).weights_sha256[:12] in str(e.value)
    assert drafter_identity(other).weights_sha256[:12] in str(e.value)
    # a damaged weights file is refused, never loaded
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "head.json").write_text((head_dir / "head.json").read_text())
    (bad / "head.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(AcceptHeadError, match="does not match"):
        read_head(bad)
    with pytest.raises(AcceptHeadError, match="not an acceptance head"):
        read_head(tmp_path)
    meta = json.loads((head_dir / "head.json").read_text())
    assert meta["drafter"]["weights_sha256"] == drafter_identity(d).weights_sha256
    assert meta["version"] == 2 and meta["vocab_size"] == _vocab(d)


def test_a_format_1_head_loads_without_token_biases(pair, tmp_path):
    """Heads saved before the per-token biases (format 1: the MLP only) still load and decode."""
    from safetensors.torch import save_file

    from omnidraft.runtime.manifest import sha256_file

    d, t, _, _ = pair
    old = random_head(32, seed=4)
    save_file({k: v.contiguous() for k, v in old.state_dict().items()}, str(tmp_path / "head.safetensors"))
    meta = {
        "format": "omnidraft.accept_head",
        "version": 1,
        "hidden_size": 32,
        "num_layers": 3,
        "drafter": {"weights_sha256": drafter_identity(d).weights_sha256, "hidden_size": 32},
        "weights_file": "head.safetensors",
        "weights_sha256": sha256_file(tmp_path / "head.safetensors"),
        "training": {},
    }
    (tmp_path / "head.json").write_text(json.dumps(meta))
    head, info = load_head(tmp_path, drafter_identity(d))
    assert info.vocab_size == 0 and head.token_bias is None and head.bias_of(7) == 0.0
    drf = load_model(d, accept_head=tmp_path)
    assert drf.backend.accept_bias(7) == 0.0
    out = SpeculativeDecoder(load_model(t), drf).generate(PROMPTS[0], DecodeConfig(max_new_tokens=6, draft_len="auto"))
    assert out.token_ids


def test_auto_needs_a_head(pair):
    d, t, _, _ = pair
    dec = SpeculativeDecoder(load_model(t), load_model(d))
    with pytest.raises(InvalidArgument, match="--accept-head HEAD, or train one with omnidraft adapt --train-head"):
        dec.generate(PROMPTS[0], DecodeConfig(max_new_tokens=4, draft_len="auto"))


# -- greedy exactness on real backends -----------------------------------------------------------------


def _check_greedy(dec: SpeculativeDecoder) -> int:
    drafted = 0
    for i, prompt in enumerate(PROMPTS):
        ref = dec.generate(prompt, DecodeConfig(max_new_tokens=16, mode="target-only"))
        for gamma in (0.2, 0.7):
            out = dec.generate(
                prompt, DecodeConfig(max_new_tokens=16, draft_len="auto", gamma=gamma, max_draft_len=2 + i), trace=True
            )
            assert out.token_ids == ref.token_ids and out.text == ref.text, (prompt, gamma)
            lens = [len(r.draft) for r in out.rounds]
            assert all(1 <= n <= 2 + i for n in lens)
            drafted += sum(lens)
    return drafted


def test_greedy_auto_identical_torch(pair):
    d, t, head_dir, _ = pair
    drf = load_model(d, accept_head=head_dir)
    assert drf.backend.has_accept_head and drf.info["accept_head"] == str(head_dir)
    cache = NgramCache(drf.codec.sha256, load_model(t).codec.sha256, drf.backend.vocab_size)
    assert _check_greedy(SpeculativeDecoder(load_model(t), drf, cache)) > 0


def test_drafting_turned_off_decodes_with_the_target_alone(pair):
    # the online controller turns drafting off (K_max 0) where plain steps are faster: same tokens,
    # no drafter call, one target call per token.
    d, t, head_dir, _ = pair
    dec = SpeculativeDecoder(load_model(t), load_model(d, accept_head=head_dir))
    for prompt in PROMPTS[:2]:
        ref = dec.generate(prompt, DecodeConfig(max_new_tokens=12, mode="target-only"))
        off = dec.generate(prompt, DecodeConfig(max_new_tokens=12, draft_len="auto", max_draft_len=0), trace=True)
        assert off.token_ids == ref.token_ids and off.stats.drafter_calls == 0 and not off.rounds
        assert off.stats.steps == len(off.token_ids)


def test_onnx_export_with_head_passes_parity_and_decodes_exactly(pair):
    from omnidraft.export.pipeline import export_model
    from omnidraft.runtime.manifest import load_manifest

    d, t, head_dir, root = pair
    res = export_model(d, "onnx", "fp32", 96, root / "onnx-head", progress=False, accept_head=head_dir)
    m = load_manifest(root / "onnx-head")
    assert (
        m.outputs[-1] == "accept_logits"
        and m.accept_head["drafter"]["weights_sha256"] == drafter_identity(d).weights_sha256
    )
    fig = res.manifest.parity["accept_head"]
    assert fig["max_abs_diff"] < 1e-4 and fig["reference"] == "fp32-eager"
    assert "--accept-head" in m.export_command
    drf = load_model(root / "onnx-head")
    assert drf.backend.has_accept_head
    eager = load_model(d, accept_head=head_dir)
    ids = drf.codec.encode(PROMPTS[0])
    lo, ao = drf.backend.forward_with_accept(ids, 0)
    le, ae = eager.backend.forward_with_accept(ids, 0)
    np.testing.assert_allclose(ao, ae, atol=1e-4)
    np.testing.assert_allclose(lo, le, atol=1e-4)
    # The per-token biases travel in the manifest (the torch-free path reads them there).
    assert m.accept_head["token_bias"] == eager.backend.head.sparse_token_bias() != {}
    for tok in range(12):
        assert drf.backend.accept_bias(tok) == pytest.approx(eager.backend.accept_bias(tok), abs=1e-7)
    tgt = load_model(t)
    cache = NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size)
    assert _check_greedy(SpeculativeDecoder(tgt, drf, cache)) > 0
    # int8: the head is quantized with the drafter and gated against its quantized reference
    res8 = export_model(
        d, "onnx", "int8", 96, root / "onnx-head-int8", progress=False, accept_head=head_dir, min_top1=0.0
    )
    fig8 = res8.manifest.parity["accept_head"]
    assert fig8["max_prob_diff"] < 0.05 and fig8["mean_prob_diff"] < 0.02
    # Negative control: the same int8 graph gated against a head that is not the one inside it.
    from omnidraft.errors import ExportError
    from omnidraft.export import parity
    from omnidraft.export.hf_model import inspect_folder
    from omnidraft.export.hf_model import load_model as load_hf_model
    from omnidraft.export.onnx_export import _head_reference
    from omnidraft.export.quantize import ort_reference
    from omnidraft.runtime.backends.ort import OrtBackend

    head, _ = load_head(head_dir)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.5 * torch.randn_like(p))
    model = load_hf_model(inspect_folder(d))
    sched = parity.parity_tokens(Path(d) / "tokenizer.json", model.config.vocab_size, 96)
    with pytest.raises(ExportError, match="acceptance head"):
        parity.gate_accept(
            OrtBackend(root / "onnx-head-int8", load_manifest(root / "onnx-head-int8")),
            sched,
            ort_reference(model, "int8"),
            _head_reference(head, "int8"),
            False,
            "the int8 graph",
        )
    with pytest.raises(InvalidArgument, match="re-export the drafter"):
        load_model(root / "onnx-head", accept_head=head_dir)


def test_a_manifest_with_bad_token_biases_is_refused(pair, tmp_path):
    import shutil

    d, _, head_dir, _ = pair
    from omnidraft.export.pipeline import export_model

    src = tmp_path / "onnx-head-bias"
    export_model(d, "onnx", "fp32", 96, src, progress=False, accept_head=head_dir)
    cases = (({"999999999": 1.0}, "outside the drafter's"), ({"5": "x"}, "malformed"), ([1, 2], "malformed"))
    for i, (bad, why) in enumerate(cases):
        dst = tmp_path / f"x{i}"
        shutil.copytree(src, dst)
        m = json.loads((dst / "manifest.json").read_text())
        m["accept_head"]["token_bias"] = bad
        (dst / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(AcceptHeadError, match=f"token_bias.*{why}|{why}.*re-export"):
            load_model(dst)


def test_export_refuses_a_head_of_another_drafter_and_executorch(pair, tmp_path):
    from omnidraft.export.pipeline import export_model

    d, _, head_dir, root = pair
    other = make_tiny_model(root / "d-other", "llama", d, seed=7, max_pos=256)
    with pytest.raises(AcceptHeadError, match="belongs to another drafter"):
        export_model(other, "onnx", "fp32", 96, tmp_path / "x", progress=False, accept_head=head_dir)
    with pytest.raises(InvalidArgument, match="--format onnx"):
        export_model(d, "executorch", "fp32", 96, tmp_path / "y", progress=False, accept_head=head_dir)
    assert not (tmp_path / "x" / "manifest.json").exists()


def test_sampling_with_auto_runs_and_is_seeded(pair):
    d, t, head_dir, _ = pair
    drf, tgt = load_model(d, accept_head=head_dir), load_model(t)
    dec = SpeculativeDecoder(tgt, drf, NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size))
    cfg = DecodeConfig(max_new_tokens=12, temperature=0.8, draft_len="auto", gamma=0.6, seed=3)
    a, b = dec.generate(PROMPTS[1], cfg, trace=True), dec.generate(PROMPTS[1], cfg)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 12
    assert all(len(r.accept_logits) == len(r.draft) for r in a.rounds)


def test_cli_export_refuses_a_foreign_head_in_one_line(pair, tmp_path, capsys):
    from omnidraft.cli import main

    d, _, head_dir, root = pair
    other = make_tiny_model(root / "d-other", "llama", d, seed=7, max_pos=256)
    rc = main(
        [
            "export",
            "--model",
            str(other),
            "--format",
            "onnx",
            "--out",
            str(tmp_path / "x"),
            "--max-seq-len",
            "64",
            "--accept-head",
            str(head_dir),
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "belongs to another drafter" in err[0] and "Traceback" not in err[0]


def test_auto_on_an_executorch_drafter_is_refused_with_the_reason(pair):
    d, t, _, _ = pair
    tgt, drf = load_model(t), load_model(d)
    fake = ScriptedDrafter([1, 2, 3], drf.backend.vocab_size)
    fake.name = "executorch"  # what ExecuTorchBackend reports; .pte exports carry no head
    dec = SpeculativeDecoder(tgt, LoadedModel(fake, drf.codec, drf.eos_ids, drf.path, "executorch"))
    with pytest.raises(InvalidArgument, match="ExecuTorch drafters do not carry an acceptance head yet"):
        dec.generate(PROMPTS[0], DecodeConfig(max_new_tokens=4, draft_len="auto"))
