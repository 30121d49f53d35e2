"""`export --onnx-path genai`: onnxruntime-genai's builder graph passes the parity gate, is row-stable
with padded one-token calls (and measurably not without), decodes exactly as a target in the loop,
carries a trimmed head and an acceptance head as a drafter, and bad fits are refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from tiny_models import make_tiny_model

from omnidraft.cli import main
from omnidraft.errors import InvalidArgument
from omnidraft.export import draft_vocab as dv
from omnidraft.export import parity
from omnidraft.export.pipeline import export_model
from omnidraft.runtime.backends.ort import OrtBackend
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.loader import load_model
from omnidraft.runtime.manifest import load_manifest
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import SpeculativeDecoder

TOK = Path(__file__).resolve().parents[1] / "models" / "tokenizers"
PROMPTS = [
    "def add(a, b):\n    return",
    "Question: Tom has 3 apples and buys 5 more. How many?\nAnswer:",
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé àccents: café, naïve",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("genai")
    # hidden 64 / 4 heads: GroupQueryAttention needs a head size that is a multiple of 16.
    drafter = make_tiny_model(root / "d", "llama", TOK / "phi3", seed=1, hidden=64, max_pos=256)
    target = make_tiny_model(root / "t", "qwen2", TOK / "gpt2", seed=2, hidden=64, max_pos=256)
    vocab = json.loads((drafter / "config.json").read_text())["vocab_size"]
    counts = np.zeros(vocab, dtype=np.int64)
    counts[np.random.default_rng(0).permutation(vocab)[:2000]] = np.arange(2000, 0, -1)
    dv.write_counts(drafter, counts, drafter / "tokenizer.json", "test counts")
    out = {"drafter": drafter, "target": target}
    for name, folder, quant, kw in (
        ("t-int8", target, "int8", {}),
        ("t-fp32", target, "fp32", {}),
        ("d-int8", drafter, "int8", {"draft_vocab": 256}),
        ("d-int4", drafter, "int4", {"draft_vocab": 256}),
    ):
        out[name] = export_model(
            folder, "onnx", quant, 96, root / name, progress=False, onnx_path="genai", min_top1=0.0, **kw
        ).out_dir
    return out


def test_the_builder_graph_passes_the_gate_and_records_how_it_was_built(built):
    m = load_manifest(built["t-fp32"])
    assert m.exporter.startswith("onnxruntime-genai") and m.inputs[:2] == ["input_ids", "attention_mask"]
    assert m.parity["max_abs_diff"] <= 1e-4 and "--onnx-path genai" in m.export_command
    t8 = load_manifest(built["t-int8"])
    assert t8.pad_single_row and t8.parity["batch_invariance"]["row_stable"]
    assert t8.parity["batch_invariance"]["verify_vs_decode_max_abs_diff"] <= 1e-3
    d8 = load_manifest(built["d-int8"])
    assert not d8.pad_single_row and d8.draft_vocab["size"] == 256  # a trimmed drafter is never a target


def test_padding_makes_decode_rows_equal_verify_rows(built):
    """The measurement that justifies pad_single_row: padded, a decode step gives its verify row
    (bit-identical on the session-12 Xeon); unpadded the same graph drifts (another kernel for one
    row, and int8 activation rounding). The bound leaves room for other CPUs' kernels."""
    m = load_manifest(built["t-int8"])
    sched = parity.parity_tokens(built["t-int8"] / "tokenizer.json", m.vocab_size, m.max_seq_len)
    padded = parity.measure_batch_invariance(OrtBackend(built["t-int8"], m), sched, m.max_seq_len)
    plain = parity.measure_batch_invariance(
        OrtBackend(built["t-int8"], replace(m, pad_single_row=False)), sched, m.max_seq_len
    )
    assert padded["verify_vs_decode_max_abs_diff"] <= min(1e-5, plain["verify_vs_decode_max_abs_diff"])


def test_a_padded_call_keeps_the_cache_of_one_token(built):
    be = load_model(built["t-int8"]).backend
    ids = load_model(built["t-int8"]).codec.encode(PROMPTS[0])
    full = be.forward(ids, 0)
    be.rollback(len(ids) - 1)
    row = be.forward(ids[-1:], len(ids) - 1)
    assert row.shape == (1, be.vocab_size) and be.cached_len == len(ids)
    assert all(p.shape[2] == len(ids) for p in be._past)
    np.testing.assert_array_equal(row[0], full[-1])


def test_a_prompt_pass_skips_the_head_and_fills_the_same_cache(built):
    """``logits_from`` defaults to every row (what onnxruntime-genai and older callers get); the
    runtime's prefill asks for the last row only and must leave the cache exactly as a full call
    does, across a row split too."""
    model = load_model(built["t-int8"])
    be, ids = model.backend, model.codec.encode(PROMPTS[1])
    sess, k = be.session, len(ids)
    feed = {
        "input_ids": np.asarray([ids]),
        "attention_mask": np.ones((1, k), dtype=np.int64),
        **{n: be._empty for n in be._past_names},
    }
    assert sess.run(["logits"], feed)[0].shape[1] == k  # not fed: every row
    assert sess.run(["logits"], {**feed, "logits_from": np.asarray([k - 1])})[0].shape[1] == 1
    for splits in ([], [5]):  # compared with a full call cut at the same place
        be._row_splits = splits
        be.reset()
        assert be.forward(ids, 0).shape == (k, be.vocab_size)
        ref_past, ref_next = [p.copy() for p in be._past], be.forward(ids[:1], k)
        be.reset()
        be.prefill(ids, 0)
        assert be.cached_len == k
        for a, b in zip(be._past, ref_past):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(be.forward(ids[:1], k), ref_next)


@pytest.mark.parametrize("drafter", ["d-int8", "d-int4"])
def test_greedy_speculative_through_genai_graphs_equals_target_only(built, drafter):
    tgt, drf = load_model(built["t-int8"]), load_model(built[drafter])
    dec = SpeculativeDecoder(tgt, drf, NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size))
    proposed = 0
    for k, prompt in enumerate(PROMPTS):
        ref = dec.generate(prompt, DecodeConfig(max_new_tokens=20, mode="target-only"))
        out = dec.generate(prompt, DecodeConfig(max_new_tokens=20, draft_len=1 + k % 4))
        assert out.token_ids == ref.token_ids, prompt
        proposed += out.stats.proposed
    assert proposed > 0


def test_an_acceptance_head_rides_in_the_builder_graph(built, tmp_path):
    from test_accept_head import random_head

    from omnidraft.runtime.draft_length.head_file import drafter_identity
    from omnidraft.runtime.draft_length.head_model import save_head

    d = built["drafter"]
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    head_dir = save_head(random_head(64, vocab_size=vocab), tmp_path / "head", drafter_identity(d), {"note": "test"})
    out = export_model(
        d, "onnx", "fp32", 96, tmp_path / "e", progress=False, onnx_path="genai", accept_head=head_dir, draft_vocab=256
    )
    m = load_manifest(out.out_dir)
    assert m.outputs[-1] == "accept_logits" and m.parity["accept_head"]["max_abs_diff"] < 1e-4
    drf, eager = load_model(out.out_dir), load_model(d, accept_head=head_dir)
    ids = drf.codec.encode(PROMPTS[1])
    _, a = drf.backend.forward_with_accept(ids, 0)
    _, b = eager.backend.forward_with_accept(ids, 0)
    np.testing.assert_allclose(a, b, atol=1e-4)
    drf.backend.reset()
    row, z = drf.backend.forward_with_accept_last(ids[:3], 0)
    assert row.shape == (drf.backend.vocab_size,) and z == pytest.approx(float(b[2]), abs=1e-4)


def test_models_the_builder_cannot_take_are_refused_or_fall_back(tmp_path, capsys):
    narrow = make_tiny_model(tmp_path / "n", "llama", TOK / "gpt2", seed=3, max_pos=128)  # head size 8
    with pytest.raises(InvalidArgument, match="multiple of 16.*use --onnx-path torch"):
        export_model(narrow, "onnx", "fp32", 64, tmp_path / "x", progress=False, onnx_path="genai")
    res = export_model(narrow, "onnx", "fp32", 64, tmp_path / "y", progress=False)  # auto
    assert res.manifest.exporter.startswith("torch.onnx")
    assert "exporting with torch.onnx" in capsys.readouterr().err
    wide = make_tiny_model(tmp_path / "w", "llama", TOK / "gpt2", seed=3, hidden=64, max_pos=128)
    with pytest.raises(InvalidArgument, match="below max_position_embeddings"):
        export_model(wide, "onnx", "fp32", 128, tmp_path / "z", progress=False, onnx_path="genai")
    code = main(
        ["export", "--model", str(wide), "--format", "onnx", "--onnx-path", "tvm", "--out", str(tmp_path / "v")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "choose one of: auto, genai, torch" in err[0]
    code = main(
        ["export", "--model", str(wide), "--format", "executorch", "--onnx-path", "genai", "--out", str(tmp_path / "v")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "--onnx-path applies to --format onnx only" in err[0]


def test_onnxruntime_genai_runs_a_target_export_from_its_kept_config(built):
    """A target export keeps the builder's genai_config.json (hashed in the manifest), so
    onnxruntime-genai's own generator runs it: the bench's ort-genai-target-only peer. Its greedy
    tokens match our unpadded target-only decode (the same one-row kernels); a trimmed drafter,
    which is never a target, keeps no such file."""
    from omnidraft.bench import ortgenai_peer
    from omnidraft.export.onnx_genai import GENAI_CONFIG

    m = load_manifest(built["t-fp32"])
    assert GENAI_CONFIG in m.extra_files and ortgenai_peer.unavailable_reason(built["t-fp32"]) is None
    assert json.loads((built["t-fp32"] / GENAI_CONFIG).read_text())["model"]["decoder"]["filename"] == m.artifact_file
    assert (
        not (built["d-int8"] / GENAI_CONFIG).exists() and GENAI_CONFIG not in load_manifest(built["d-int8"]).extra_files
    )
    assert "re-export" in ortgenai_peer.unavailable_reason(built["d-int8"])

    tgt = load_model(built["t-fp32"])
    plain = OrtBackend(built["t-fp32"], replace(m, pad_single_row=False))
    peer = ortgenai_peer.OrtGenaiPeer(built["t-fp32"], frozenset(), threads=1)
    for prompt in PROMPTS:
        ids = list(tgt.codec.start_ids) + tgt.codec.encode(prompt)
        plain.reset()
        seq = list(ids)
        for _ in range(12):
            row = plain.forward(seq[plain.cached_len :], plain.cached_len)[-1]
            seq.append(int(np.argmax(row)))
        assert peer.generate(ids, 12) == seq[len(ids) :], prompt
