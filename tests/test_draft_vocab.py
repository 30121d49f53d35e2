"""`export --draft-vocab N`: a drafter's output layer cut to its N most frequent tokens.

The artifact scores the N kept tokens and the backend widens its rows (the others at NEG_LOGIT);
the kept columns are the untrimmed model's; a trimmed drafter never drafts a dropped token and
greedy output stays target-only's; a trimmed export is refused as a target; bad counts, sizes and
manifests get one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tiny_models import make_tiny_model

from omnidraft.cli import main
from omnidraft.errors import InvalidArgument, ManifestError, ModelFolderError
from omnidraft.export import draft_vocab as dv
from omnidraft.export.pipeline import export_model
from omnidraft.runtime.backends.base import NEG_LOGIT
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.loader import load_model
from omnidraft.runtime.manifest import load_manifest
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import SpeculativeDecoder

TOK = Path(__file__).resolve().parents[1] / "models" / "tokenizers"
SIZE = 512
PROMPTS = [
    "def add(a, b):\n    return",
    "Question: Tom has 3 apples and buys 5 more. How many?\nAnswer:",
    "The quick brown fox jumps over the lazy dog.",
]


def _counts(vocab: int, seed: int = 0) -> np.ndarray:
    # Zipf-like counts over a shuffled order, so the kept set is neither a prefix of ids nor all of them.
    rng = np.random.default_rng(seed)
    counts = np.zeros(vocab, dtype=np.int64)
    counts[rng.permutation(vocab)[:3000]] = (1e6 / np.arange(1, 3001)).astype(np.int64) + 1
    return counts


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dv")
    drafter = make_tiny_model(root / "d", "llama", TOK / "phi3", seed=1, max_pos=256)
    target = make_tiny_model(root / "t", "qwen2", TOK / "gpt2", seed=2, layers=1, max_pos=256)
    vocab = json.loads((drafter / "config.json").read_text())["vocab_size"]
    dv.write_counts(drafter, _counts(vocab), drafter / "tokenizer.json", "test counts")
    return {
        "drafter": drafter,
        "target": target,
        "full": export_model(drafter, "onnx", "fp32", 96, root / "full", progress=False).out_dir,
        "trim": export_model(drafter, "onnx", "fp32", 96, root / "trim", progress=False, draft_vocab=SIZE).out_dir,
        "trim8": export_model(drafter, "onnx", "int8", 96, root / "trim8", progress=False, draft_vocab=SIZE).out_dir,
        "target-onnx": export_model(target, "onnx", "int8", 96, root / "t-onnx", progress=False).out_dir,
    }


def test_choose_ranks_by_count_keeps_specials_and_reports_coverage(pair):
    folder = pair["drafter"]
    counts = dv.read_counts(folder, len(_counts(32064)))
    v = dv.choose(folder, SIZE, counts.size, [0, 1, 2])
    assert len(v.kept) == SIZE and list(v.kept) == sorted(v.kept) and {0, 1, 2} <= set(v.kept.tolist())
    order = np.lexsort((np.arange(counts.size), -counts))
    assert set(order[: SIZE - 3].tolist()) - {0, 1, 2} <= set(v.kept.tolist())
    assert v.coverage == pytest.approx(counts[v.kept].sum() / counts.sum())
    entry = v.manifest_entry()
    assert entry["size"] == SIZE and entry["of"] == counts.size and entry["kept"] == v.kept.tolist()


def test_export_keeps_the_signature_and_the_kept_columns(pair):
    m = load_manifest(pair["trim"])
    assert m.draft_vocab["size"] == SIZE and m.draft_vocab["source"] == dv.COUNTS_FILE
    assert "--draft-vocab 512" in m.export_command and m.outputs == load_manifest(pair["full"]).outputs
    kept = dv.choose(
        pair["drafter"], SIZE, m.vocab_size, dv.special_ids(pair["drafter"], m.bos_token_id, m.eos_token_ids)
    ).kept
    assert m.draft_vocab["kept"] == kept.tolist()
    full, trim = load_model(pair["full"]).backend, load_model(pair["trim"]).backend
    assert trim.session.get_outputs()[0].shape[-1] == SIZE  # the graph scores the kept tokens only
    ids = [5, 17, 300, 1200, 42, 9]
    a, b = full.forward(ids, 0), trim.forward(ids, 0)
    assert b.shape == a.shape
    np.testing.assert_allclose(b[:, kept], a[:, kept], atol=1e-5)
    dropped = np.setdiff1d(np.arange(m.vocab_size), kept)
    assert (b[:, dropped] == NEG_LOGIT).all()
    assert load_manifest(pair["trim8"]).parity["top1_agreement"] >= 0.9


def test_trimmed_drafter_drafts_only_kept_tokens_and_output_is_exact(pair):
    tgt, drf = load_model(pair["target-onnx"]), load_model(pair["trim8"])
    kept = set(
        dv.choose(pair["drafter"], SIZE, drf.backend.vocab_size, dv.special_ids(pair["drafter"], 1, [2])).kept.tolist()
    )
    dec = SpeculativeDecoder(tgt, drf, NgramCache(drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size))
    drafted = []
    for k, prompt in enumerate(PROMPTS):
        ref = dec.generate(prompt, DecodeConfig(max_new_tokens=16, mode="target-only"))
        for temp in (0.0, 0.8):
            out = dec.generate(
                prompt, DecodeConfig(max_new_tokens=16, draft_len=2 + k, temperature=temp, seed=k), trace=True
            )
            if temp == 0:
                assert out.token_ids == ref.token_ids, prompt
            drafted += [d for r in out.rounds for d in r.draft]
    assert drafted and set(drafted) <= kept


def test_a_trimmed_export_is_refused_as_target(pair, capsys):
    with pytest.raises(InvalidArgument, match="keeps only 512 tokens.*re-export it without --draft-vocab"):
        SpeculativeDecoder(load_model(pair["trim"]))
    code = main(["generate", "--target", str(pair["trim"]), "--mode", "target-only", "--prompt", "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "--draft-vocab" in err[0]


def test_bad_sizes_counts_and_corpora_are_refused(pair, tmp_path, capsys):
    d = pair["drafter"]
    with pytest.raises(InvalidArgument, match=r"--draft-vocab must be within \[64, 32063\]"):
        export_model(d, "onnx", "fp32", 96, tmp_path / "x", progress=False, draft_vocab=32064)
    bare = tmp_path / "bare"
    shutil.copytree(d, bare)
    (bare / dv.COUNTS_FILE).unlink()
    with pytest.raises(InvalidArgument, match="no token_counts.json; pass --vocab-corpus FILE"):
        export_model(bare, "onnx", "fp32", 96, tmp_path / "x", progress=False, draft_vocab=SIZE)
    (bare / dv.COUNTS_FILE).write_text('{"counts": [1, 2], "tokenizer_sha256": "x"}')
    with pytest.raises(ModelFolderError, match="belongs to another model"):
        export_model(bare, "onnx", "fp32", 96, tmp_path / "x", progress=False, draft_vocab=SIZE)
    (bare / dv.COUNTS_FILE).write_text("{not json")
    with pytest.raises(ModelFolderError, match="malformed"):
        export_model(bare, "onnx", "fp32", 96, tmp_path / "x", progress=False, draft_vocab=SIZE)
    other = _counts(32064).tolist()
    (bare / dv.COUNTS_FILE).write_text(json.dumps({"counts": other, "tokenizer_sha256": "0" * 64}))
    with pytest.raises(ModelFolderError, match="another tokenizer"):
        export_model(bare, "onnx", "fp32", 96, tmp_path / "x", progress=False, draft_vocab=SIZE)
    with pytest.raises(InvalidArgument, match="does not exist"):
        export_model(
            bare,
            "onnx",
            "fp32",
            96,
            tmp_path / "x",
            progress=False,
            draft_vocab=SIZE,
            vocab_corpus=tmp_path / "none.txt",
        )
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00abc")
    with pytest.raises(InvalidArgument, match="UTF-8"):
        export_model(
            bare,
            "onnx",
            "fp32",
            96,
            tmp_path / "x",
            progress=False,
            draft_vocab=SIZE,
            vocab_corpus=tmp_path / "bin.txt",
        )
    with pytest.raises(InvalidArgument, match="add --draft-vocab"):
        export_model(bare, "onnx", "fp32", 96, tmp_path / "x", progress=False, vocab_corpus=tmp_path / "bin.txt")
    code = main(["export", "--model", str(d), "--format", "onnx", "--draft-vocab", "10", "--out", str(tmp_path / "y")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "--draft-vocab must be within" in err[0]


def test_a_corpus_ranks_the_tokens(pair, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\n" * 50 + "def f(x): return x\n" * 20, encoding="utf-8")
    counts = dv.count_corpus(corpus, pair["drafter"] / "tokenizer.json", 32064)
    v = dv.choose(pair["drafter"], 64, 32064, [], corpus)
    assert v.source == "corpus c.txt" and v.coverage == 1.0  # fewer distinct tokens than 64
    assert set(np.flatnonzero(counts).tolist()) <= set(v.kept.tolist())


def test_executorch_llm_path_trims_too(pair, tmp_path):
    out = export_model(
        pair["drafter"], "executorch", "fp32", 96, tmp_path / "pte", progress=False, et_path="llm", draft_vocab=SIZE
    ).out_dir
    m = load_manifest(out)
    assert m.draft_vocab["size"] == SIZE and m.parity["max_abs_diff"] <= 1e-4
    logits = load_model(out).backend.forward([5, 17, 300], 0)
    assert (logits == NEG_LOGIT).sum(-1).tolist() == [m.vocab_size - SIZE] * 3


def test_a_malformed_kept_list_is_refused(pair, tmp_path):
    d = tmp_path / "e"
    shutil.copytree(pair["trim"], d)
    data = json.loads((d / "manifest.json").read_text())
    kept = data["draft_vocab"]["kept"]
    for bad in (kept[::-1], kept[:-1], [-1] + kept[1:]):
        data["draft_vocab"]["kept"] = bad
        (d / "manifest.json").write_text(json.dumps(data))
        # The manifest's own checks refuse a short or out-of-range list, the backend an unsorted one.
        with pytest.raises(ManifestError, match="draft_vocab.*re-export"):
            load_model(d)
