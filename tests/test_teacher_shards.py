"""Teacher passes: a target of another vocabulary, run teacher-forced over training text, stored as
hybrid-loss records in the drafter's positions; a recipe trains on several of them at once, resumes
bit-identically, and every bad pass (unmappable teacher, corrupted or unfinished shards, another
drafter's tokenizer, an interrupted pass) is one clear error or a resume."""

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_train_recipe import final_weights

from omnidraft.errors import DataError, InvalidArgument
from omnidraft.models import teacher_shards as S
from omnidraft.models import teacher_store as store
from omnidraft.models import train as T
from omnidraft.models.train_resources import memory_estimate

TEXTS = [
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "The river ran past the old mill, and the miller's daughter counted the boats.",
    "Question: Tom has 12 apples and buys 30 more. How many? Answer: 12 + 30 = 42.",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i, 'even')\n",
    "She opened the letter slowly; the words inside were older than the house.",
]
SPEC = S.PassSpec(k=8, texts_per_shard=2, max_tokens=96)


@pytest.fixture(scope="module")
def passed(tiny_pair, tmp_path_factory):
    drafter, target = tiny_pair
    out = tmp_path_factory.mktemp("pass") / "qwen-like"
    S.teacher_pass(teacher=target, drafter=drafter, texts=TEXTS, out=out, spec=SPEC, progress=False)
    return out


def sha(drafter) -> str:
    from omnidraft.runtime.tokenizer import load_codec

    return load_codec(drafter).sha256


def test_a_stored_position_holds_the_teachers_own_distribution_at_that_text_prefix(tiny_pair, passed):
    """Independent of the collector: re-run the teacher on the text the drafter row has seen and
    compare its renormalised top entries over the intersection with what the shard stored."""
    from omnidraft.export.hf_model import inspect_folder, load_model
    from omnidraft.runtime.tokenizer import load_codec
    from omnidraft.runtime.vocab import build_vocab_map

    drafter, target = tiny_pair
    dc, tc = load_codec(drafter), load_codec(target)
    vocab = build_vocab_map(dc, tc)
    ts = store.load_teacher_set(passed, drafter_tokenizer_sha256=dc.sha256)
    assert len(ts.records) == len(TEXTS) and np.array_equal(ts.inter, vocab.drafter_ids)
    model = load_model(inspect_folder(target))
    checked = 0
    for text, rec in zip(TEXTS[:2], ts.records[:2]):
        assert len(rec.dm_rows) > 0
        start = len(dc.start_ids)
        virtual = len(dc.spell(rec.ids[start:].tolist())) - len(text.encode())  # SentencePiece's leading "▁"
        t_ids = tc.encode(text)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([list(tc.start_ids) + t_ids])).logits[0]
        for i, row in enumerate(rec.dm_rows[:6]):
            prefix = dc.spell(rec.ids[start : row + 1].tolist())[virtual:]
            label = int(rec.ids[row + 1])
            j = next(j for j in range(1, len(t_ids)) if tc.spell(t_ids[:j]) == prefix)  # a teacher token boundary
            row_logits = logits[len(tc.start_ids) + j - 1]
            logp = torch.log_softmax(row_logits[torch.from_numpy(vocab.target_ids)].double(), -1)
            top = torch.topk(logp, SPEC.k)
            assert ts.inter[rec.dm_idx[i, 0]] == vocab.drafter_ids[top.indices[0]]
            np.testing.assert_allclose(rec.dm_logp[i].astype(np.float64), top.values.numpy(), atol=2e-2, rtol=2e-3)
            assert vocab.d2t[label] >= 0  # the row's label is directly mapped
            mass = np.exp(rec.dm_logp[i].astype(np.float64)).sum() + np.exp(rec.dm_tail[i]) * (vocab.size - SPEC.k)
            assert mass == pytest.approx(1.0, abs=1e-2)
            checked += 1
    assert checked >= 6


def die_on_the_second_shard(monkeypatch):
    """Makes the pass stop (as a Ctrl-C would) when its second shard starts; returns what to restore."""
    real, calls = S._records_of, []

    def dies(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(S, "_records_of", dies)
    return real


def test_an_interrupted_pass_resumes_to_the_same_shards(tiny_pair, passed, tmp_path, monkeypatch):
    drafter, target = tiny_pair
    real = die_on_the_second_shard(monkeypatch)
    out = tmp_path / "p"
    with pytest.raises(KeyboardInterrupt):
        S.teacher_pass(teacher=target, drafter=drafter, texts=TEXTS, out=out, spec=SPEC, progress=False)
    assert len(json.loads((out / store.MANIFEST).read_text())["shards"]) == 1
    with pytest.raises(DataError, match="unfinished"):
        store.load_teacher_set(out, drafter_tokenizer_sha256=sha(drafter))
    monkeypatch.setattr(S, "_records_of", real)
    S.teacher_pass(teacher=target, drafter=drafter, texts=TEXTS, out=out, spec=SPEC, progress=False)
    assert (out / store.MANIFEST).read_text() == (passed / store.MANIFEST).read_text()
    for f in sorted(passed.glob("shard-*")):
        assert (out / f.name).read_bytes() == f.read_bytes()
    with pytest.raises(InvalidArgument, match="another texts_sha256"):
        S.teacher_pass(teacher=target, drafter=drafter, texts=TEXTS[:3], out=out, spec=SPEC, progress=False)


def test_the_auto_dtype_is_bfloat16_only_where_the_cpu_has_bf16_matmuls_and_a_resumed_pass_keeps_its_own(
    tiny_pair, tmp_path, monkeypatch
):
    drafter, target = tiny_pair
    cpu = torch.device("cpu")
    for caps, want in (
        ({"avx512_bf16": True}, "bfloat16"),
        ({"amx_bf16": True}, "bfloat16"),
        ({"avx2": True}, "float32"),
    ):
        monkeypatch.setattr(torch.cpu, "get_capabilities", lambda caps=caps: caps)
        assert S.fast_dtype(cpu) == want
    real = die_on_the_second_shard(monkeypatch)
    out, spec = tmp_path / "p", S.PassSpec(k=8, texts_per_shard=2, max_tokens=96, dtype="bfloat16")
    with pytest.raises(KeyboardInterrupt):
        S.teacher_pass(teacher=target, drafter=drafter, texts=TEXTS, out=out, spec=spec, progress=False)
    monkeypatch.setattr(S, "_records_of", real)
    m = S.teacher_pass(
        teacher=target,
        drafter=drafter,
        texts=TEXTS,
        out=out,
        spec=S.PassSpec(**{**vars(spec), "dtype": "auto"}),
        progress=False,
    )  # the last capabilities above say float32, but the pass began in bfloat16
    assert m["spec"]["dtype"] == "bfloat16" and len(m["shards"]) == 3
    fresh = S.teacher_pass(
        teacher=target,
        drafter=drafter,
        texts=TEXTS[:2],
        out=tmp_path / "q",
        spec=S.PassSpec(dtype="auto"),
        progress=False,
    )
    assert fresh["spec"]["dtype"] == "float32"


def test_a_corrupted_or_foreign_pass_is_refused_with_the_command_that_rebuilds_it(tiny_pair, passed, tmp_path):
    drafter, _ = tiny_pair
    bad = tmp_path / "bad"
    shutil.copytree(passed, bad)
    shard = bad / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="corrupted.*teacher_shards --teacher"):
        store.load_teacher_set(bad, drafter_tokenizer_sha256=sha(drafter))
    with pytest.raises(DataError, match="another drafter tokenizer"):
        store.load_teacher_set(passed, drafter_tokenizer_sha256="0" * 64)
    (bad / store.MANIFEST).write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        store.load_teacher_set(bad, drafter_tokenizer_sha256=sha(drafter))


def test_a_teacher_whose_tokenizer_cannot_be_mapped_is_refused_before_its_weights_load(tiny_pair, tmp_path):
    from tokenizers import Tokenizer, models

    drafter, _ = tiny_pair
    folder = tmp_path / "teacher"
    folder.mkdir()
    tok = Tokenizer(models.BPE(vocab={"<a>": 0, "<b>": 1}, merges=[]))
    tok.add_special_tokens(["<a>", "<b>"])
    tok.save(str(folder / "tokenizer.json"))  # no weights at all: the refusal comes first
    with pytest.raises(InvalidArgument, match="shares no token spelling.*cannot be mapped"):
        S.teacher_pass(teacher=folder, drafter=drafter, texts=TEXTS, out=tmp_path / "o", spec=SPEC, progress=False)
    assert not (tmp_path / "o").exists()


def test_the_cli_says_what_is_wrong_in_one_line(capsys):
    assert S.main(["--teacher", "x", "--drafter", "y", "--out", "z", "--mix", "poetry=1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--mix domains are code, math, text" in err[0]
    if not torch.cuda.is_available():
        assert S.main(["--teacher", "x", "--drafter", "y", "--out", "z", "--chars", "500", "--device", "cuda"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--device cuda" in err[0] and "--device cpu" in err[0]
    for bad, says in (
        (["--stream", "code", "--sample-temperature", "-1"], "--sample-temperature must be >= 0"),
        (["--stream", "code", "--samples", "4"], "--samples must be >= 1, and > 1 only with --sample-temperature"),
        (["--sample-temperature", "1"], "--sample-temperature samples answers, so it needs --stream"),
        (["--stream", "code", "--skip-prompts", "-1"], "--skip-prompts >= 0"),
        (
            ["--stream", "code", "--skip-prompts", "100000", "--prompts", "8"],
            "training prompts, fewer than --skip-prompts 100000 + --prompts 8",
        ),
    ):
        assert S.main(["--teacher", "x", "--drafter", "y", "--out", "z", *bad]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err


def cross_recipe(drafter, sets: list, lm_weight: float = 0.5) -> dict:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(drafter))
    return {
        "name": "cross",
        "arch": "llama",
        "tokenizer": str(drafter / "tokenizer.json"),
        "commit_tokenizer": True,
        "model": {
            "vocab_size": cfg.vocab_size,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 256,
            "tie_word_embeddings": True,
        },
        "data": {"mix": {"math": 1.0}, "seq_len": 32, "bos_id": 1, "eos_id": 2, "chars_per_token": 3},
        "train": {
            "seed": 5,
            "steps": 6,
            "batch_size": 2,
            "lr": 0.02,
            "min_lr_ratio": 0.5,
            "warmup_steps": 1,
            "weight_decay": 0.0,
            "grad_clip": 1.0,
            "checkpoint_every": 2,
            "threads": 1,
        },
        "export": {"dtype": "float32"},
        "teachers": {"lm_weight": lm_weight, "records_per_step": 2, "seq_len": 96, "sets": sets},
    }


def test_training_on_two_teachers_lowers_their_loss_and_resumes_bit_identically(tiny_pair, passed, tmp_path):
    from omnidraft.adapt.loss import hybrid_loss, make_batch
    from omnidraft.models.distill import CrossVocabTeachers

    drafter, _ = tiny_pair
    sets = [{"shards": str(passed), "weight": 1.0}, {"shards": str(passed), "weight": 0.5}]
    r = cross_recipe(drafter, sets, lm_weight=0.0)

    def teacher_loss(weights) -> float:
        model = T.build_model(r)
        if weights is not None:
            model.load_state_dict(weights, strict=False)  # the tied head is saved once, as the embedding
        ts = CrossVocabTeachers(r["teachers"], tokenizer_path=drafter / "tokenizer.json", seed=0).sets[0]
        b = make_batch(ts.records, "hybrid", ts.k, seq_len=96)
        with torch.no_grad():
            return hybrid_loss(model(input_ids=b.ids).logits, torch.from_numpy(ts.inter), *b.inputs()[1:]).item()

    T.train(r, work_dir=tmp_path / "a", out_dir=None, resume=False, quiet=True)
    assert teacher_loss(final_weights(tmp_path / "a")) < 0.9 * teacher_loss(None)
    T.train(r, work_dir=tmp_path / "b", out_dir=None, resume=False, stop_after=3, quiet=True)
    T.train(r, work_dir=tmp_path / "b", out_dir=None, resume=True, quiet=True)
    a, b = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)
    T.train(cross_recipe(drafter, sets[:1]), work_dir=tmp_path / "c", out_dir=None, resume=False, quiet=True)
    c = final_weights(tmp_path / "c")
    assert not all(torch.equal(a[k], c[k]) for k in a)  # the LM term and teacher weights both reach the weights


def test_a_recipe_whose_teacher_pass_was_damaged_fails_before_training(tiny_pair, passed, tmp_path):
    drafter, _ = tiny_pair
    bad = tmp_path / "bad"
    shutil.copytree(passed, bad)
    (bad / "shard-00000.safetensors").unlink()
    r = cross_recipe(drafter, [{"shards": str(bad)}])
    with pytest.raises(DataError, match="shard-00000.safetensors is missing"):
        T.train(r, work_dir=tmp_path / "w", out_dir=None, resume=False, quiet=True)
    assert not (tmp_path / "w" / "checkpoints").exists()


def test_answers_are_the_teachers_greedy_tokens_whatever_the_batch(tiny_pair):
    """Prompts of different lengths answered together (left padding) give each prompt the tokens and
    logits that step-by-step argmax decoding of that prompt alone gives."""
    from omnidraft.export.hf_model import inspect_folder, load_model
    from omnidraft.runtime.tokenizer import load_codec

    _, target = tiny_pair
    tc, model = load_codec(target), load_model(inspect_folder(target))
    prompts = [TEXTS[0][:20], TEXTS[1], TEXTS[2][:9]]
    spec = S.PassSpec(generate=6, batch=3)
    got = list(S._answers(prompts, model, tc, spec))
    for prompt, (ids, answer, logits) in zip(prompts, got):
        seq = list(tc.start_ids) + tc.encode(prompt)
        assert ids == seq
        want, rows = [], []
        for _ in range(6):
            with torch.no_grad():
                row = model(input_ids=torch.tensor([seq + want])).logits[0, -1]
            if int(row.argmax()) in tc.eos_ids:
                break
            want.append(int(row.argmax()))
            rows.append(row.numpy())
        assert answer == want
        np.testing.assert_allclose(logits, np.stack(rows), atol=1e-3 * float(np.abs(rows).max()))


def test_a_generating_pass_stores_one_record_per_answered_prompt(tiny_pair, tmp_path, monkeypatch):
    drafter, target = tiny_pair
    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path))  # cache:NAME is a pass in the project cache
    spec = S.PassSpec(k=4, generate=5, batch=2, texts_per_shard=2)
    m = S.teacher_pass(teacher=target, drafter=drafter, texts=TEXTS[:3], out="cache:g", spec=spec, progress=False)
    assert [s["records"] for s in m["shards"]] == [2, 1] and m["spec"]["generate"] == 5
    assert (tmp_path / "teachers" / "g" / store.MANIFEST).is_file()
    assert len(store.load_teacher_set("cache:g", drafter_tokenizer_sha256=sha(drafter)).records) == 3
    from omnidraft.export.hf_model import inspect_folder, load_model
    from omnidraft.runtime.tokenizer import load_codec

    answers = list(S._answers(TEXTS[:3], load_model(inspect_folder(target)), load_codec(target), spec))
    assert sum(s["teacher_tokens"] for s in m["shards"]) == sum(len(a) for _, a, _ in answers) > 0


def test_sampled_answers_follow_the_teachers_tempered_distribution_with_no_cut(tiny_pair):
    """The first token of 600 answers sampled at T = 1.5 from one prompt: the share of the most likely
    tokens holding half the mass, and of the tokens outside the top 50 (what a default top-k cut would
    drop), each within five binomial standard errors of softmax(logits / T); and the logits rows stay
    the teacher's own."""
    from omnidraft.export.hf_model import inspect_folder, load_model
    from omnidraft.runtime.tokenizer import load_codec

    _, target = tiny_pair
    tc, model = load_codec(target), load_model(inspect_folder(target))
    n, temp = 600, 1.5
    spec = S.PassSpec(generate=1, batch=n, sample_temperature=temp, seed=3)
    got = list(S._answers([TEXTS[1]] * n, model, tc, spec))
    with torch.no_grad():
        row = model(input_ids=torch.tensor([got[0][0]])).logits[0, -1]
    probs = torch.softmax(row / temp, -1).double().numpy()
    order = np.argsort(-probs)
    firsts = np.array([a[0] if a else int(next(iter(tc.eos_ids))) for _, a, _ in got])
    half = int(np.searchsorted(np.cumsum(probs[order]), 0.5)) + 1
    for name, members in (("half the mass", order[:half]), ("beyond the top 50", order[50:])):
        want = float(probs[members].sum())
        assert want > 0.05, f"the check needs mass in {name} ({want:.3f})"
        seen = float(np.isin(firsts, members).mean())
        assert abs(seen - want) < 5 * max(np.sqrt(want * (1 - want) / n), 1 / n), (name, seen, want)
    sampled = [(a, rows) for _, a, rows in got if a]
    np.testing.assert_allclose(sampled[0][1][0], row.numpy(), atol=1e-4 * float(row.abs().max()))


def test_a_sampled_pass_is_seeded_resumes_to_the_same_shards_and_differs_from_greedy(tiny_pair, tmp_path, monkeypatch):
    drafter, target = tiny_pair
    spec = S.PassSpec(k=4, generate=12, batch=2, texts_per_shard=2, sample_temperature=1.0, seed=7)
    texts = [TEXTS[0][:20]] * 2 + [TEXTS[2][:30]] * 2

    def run(out, spec=spec):
        S.teacher_pass(teacher=target, drafter=drafter, texts=texts, out=out, spec=spec, progress=False)
        return [f.read_bytes() for f in sorted(out.glob("shard-*"))]

    whole = run(tmp_path / "a")
    real = die_on_the_second_shard(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b")
    monkeypatch.setattr(S, "_records_of", real)
    assert run(tmp_path / "b") == whole  # the resumed shard sampled what the uninterrupted run did
    from dataclasses import replace

    assert run(tmp_path / "c", replace(spec, seed=8)) != whole
    assert run(tmp_path / "d", replace(spec, sample_temperature=0.0, seed=0)) != whole
    with pytest.raises(InvalidArgument, match="another spec"):
        run(tmp_path / "a", replace(spec, seed=8))


def test_a_teacher_recipe_too_big_for_memory_is_refused_in_one_line(tiny_pair, passed, tmp_path, capsys):
    drafter, _ = tiny_pair
    r = cross_recipe(drafter, [{"shards": str(passed)}])
    small = memory_estimate(r)
    r["teachers"]["records_per_step"] = 10**6
    assert memory_estimate(r) > 100 * small
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(r))
    assert T.main(["--recipe", str(path), "--work-dir", str(tmp_path / "w"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs about" in err[0] and "teachers.records_per_step" in err[0]
    assert not (tmp_path / "out").exists()


def test_the_committed_teacher_recipe_widens_the_bundled_drafter_and_names_cache_passes():
    r = T.load_recipe("drafter-teachers")
    bundled = T.load_recipe("drafter")
    assert r["tokenizer"] == bundled["tokenizer"] and r["model"]["vocab_size"] == bundled["model"]["vocab_size"]
    assert r["model"]["num_hidden_layers"] == bundled["model"]["num_hidden_layers"]
    assert r["model"]["hidden_size"] == 2 * bundled["model"]["hidden_size"]
    assert r["init"] == {"model": "models/bundled/drafter", "layers": [0, 1], "widen": True}
    sets = r["teachers"]["sets"]
    passes = [p for s in sets for p in ([s["shards"]] if isinstance(s["shards"], str) else s["shards"])]
    assert all(p.startswith("cache:") for p in passes) and len(set(passes)) == len(passes)
    # a 1,000-answer pass per (real target, stream) the demo decodes, so the shipped drafter has seen
    # each one write; any further pass answers one of those same pairs
    from omnidraft.bench.demo import REAL_TARGETS

    pairs = [f"cache:{target}-{stream}-" for target, streams in REAL_TARGETS for stream in streams]
    assert {f"{pair}1000" for pair in pairs} <= set(passes)
    assert all(any(p.startswith(pair) for pair in pairs) for p in passes)
    # the shipped weights are this recipe's
    from omnidraft.models.train import BUNDLED_DIR

    summary = json.loads((BUNDLED_DIR / "drafter-teachers" / "training_summary.json").read_text())
    assert summary["recipe"] == r


def dense_loss_on_a_cut_head(b, logits, inter, kept, *, divergence: str) -> float:
    """The hybrid loss written out position by position in float64: at a directly-mapped position the
    KL between the teacher's stored distribution (top-K plus tail) and the drafter's, both over the
    intersection tokens the head keeps, in the given direction; at an n-gram position the weighted
    cross-entropy of its label when the head keeps it."""
    from omnidraft.adapt.loss import LAMBDA

    inter = torch.from_numpy(np.asarray(inter))
    in_head = torch.zeros(logits.shape[-1], dtype=torch.bool)
    in_head[kept] = True
    s = in_head[inter]
    total, count = 0.0, 0.0
    for i, j in zip(*torch.nonzero(b.dm_mask > 0, as_tuple=True)):
        log_p = torch.full((len(inter),), b.tail[i, j].item(), dtype=torch.float64)
        log_p[b.topk_idx[i, j]] = b.topk_logp[i, j].double()
        log_q = torch.log_softmax(logits[i, j, inter[s]].double(), -1)
        if divergence == "forward":
            total += (log_p[s].exp() * (log_p[s] - log_q)).sum().item()
        else:
            total += (log_q.exp() * (log_q - log_p[s])).sum().item()
        count += 1
    for i, j in zip(*torch.nonzero(b.ng_mask > 0, as_tuple=True)):
        label = b.labels[i, j].item()
        if in_head[label]:
            w = b.ng_mask[i, j].item()
            total += LAMBDA * w * -torch.log_softmax(logits[i, j, kept].double(), -1)[label // 2].item()
            count += w
    return total / count


def test_the_training_loss_equals_the_hybrid_loss_and_a_cut_head_renormalises_over_its_tokens(tiny_pair, passed):
    """The trainer's teacher term sends only loss rows through the head; with every token kept it is
    the adapter's hybrid loss on the whole batch, and with a cut head it is the KL to the teacher
    (top-K + tail) over the kept part of the intersection plus the n-gram NLL of the kept labels,
    computed here from dense distributions."""
    from omnidraft.adapt.loss import hybrid_loss, make_batch
    from omnidraft.models.distill import CrossVocabTeachers

    drafter, _ = tiny_pair
    r = cross_recipe(drafter, [{"shards": str(passed), "weight": 1.0}], lm_weight=0.0)
    teachers = CrossVocabTeachers(r["teachers"], tokenizer_path=drafter / "tokenizer.json", seed=0)
    model = T.build_model(r)
    ts = teachers.sets[0]
    b = make_batch(teachers._records(0, 0), "hybrid", ts.k, seq_len=teachers.seq_len)
    with torch.no_grad():
        full = hybrid_loss(model(input_ids=b.ids).logits, torch.from_numpy(ts.inter), *b.inputs()[1:])
        assert teachers.loss(model, 0).item() == pytest.approx(full.item(), rel=1e-5)
        vocab = model.config.vocab_size
        assert teachers.loss(model, 0, torch.arange(vocab)).item() == pytest.approx(full.item(), rel=1e-5)

        # a head of every other token: half the intersection and some n-gram labels fall outside it
        kept = torch.arange(0, vocab, 2)
        want = dense_loss_on_a_cut_head(b, model(input_ids=b.ids).logits, ts.inter, kept, divergence="reverse")
        assert teachers.loss(model, 0, kept).item() == pytest.approx(want, rel=1e-4)


def test_the_head_counts_every_token_a_run_asks_the_drafter_to_propose(tiny_pair, passed):
    """A cut head is ranked by the corpus rows plus the teacher tokens the run trains on: the token
    after each loss row, once per draw of its record, over a run that ends mid-epoch."""
    from omnidraft.models.distill import CrossVocabTeachers

    drafter, _ = tiny_pair
    sets = [{"shards": str(passed), "weight": 1.0}, {"shards": str(passed), "weight": 0.5}]
    teachers = CrossVocabTeachers(
        cross_recipe(drafter, sets)["teachers"], tokenizer_path=drafter / "tokenizer.json", seed=3
    )
    vocab, steps = json.loads((drafter / "config.json").read_text())["vocab_size"], 7
    want = np.zeros(vocab, dtype=np.int64)
    for i in range(len(sets)):
        for step in range(steps):
            for rec in teachers._records(i, step):
                rows = np.concatenate([rec.dm_rows, rec.ng_rows]).astype(np.int64) + 1
                np.add.at(want, rec.ids[rows[rows < len(rec.ids)]], 1)
    assert steps * teachers.per_step % len(teachers.sets[0].records) != 0  # the run ends mid-epoch
    assert np.array_equal(teachers.token_counts(steps, vocab), want)


def test_a_batch_of_several_steps_holds_exactly_their_teacher_records(tiny_pair, passed):
    from omnidraft.models.distill import CrossVocabTeachers

    drafter, _ = tiny_pair
    r = cross_recipe(drafter, [{"shards": str(passed)}])
    t = CrossVocabTeachers(r["teachers"], tokenizer_path=drafter / "tokenizer.json", seed=3)
    for step in (0, 1, 5):  # across the end of an epoch of the pass's few records too
        wide = t._records(0, step, 3)
        assert [id(x) for x in wide] == [id(x) for s in range(step, step + 3) for x in t._records(0, s)]


def test_a_set_trains_on_its_passs_first_answers_and_a_bad_count_is_refused(tiny_pair, passed):
    from omnidraft.models.distill import CrossVocabTeachers

    drafter, _ = tiny_pair
    path = drafter / "tokenizer.json"
    whole = CrossVocabTeachers(
        cross_recipe(drafter, [{"shards": str(passed)}])["teachers"], tokenizer_path=path, seed=3
    )
    r = cross_recipe(drafter, [{"shards": str(passed), "answers": 2}])
    first = CrossVocabTeachers(r["teachers"], tokenizer_path=path, seed=3)
    assert len(whole.sets[0].records) == len(TEXTS) > 2
    assert [rec.ids.tolist() for rec in first.sets[0].records] == [
        rec.ids.tolist() for rec in whole.sets[0].records[:2]
    ]
    drawn = {tuple(rec.ids.tolist()) for step in range(4) for rec in first._records(0, step)}
    assert drawn == {tuple(rec.ids.tolist()) for rec in whole.sets[0].records[:2]}

    for bad, message in (
        (0, ">= 1"),
        (2.5, ">= 1"),
        (True, ">= 1"),
        (len(TEXTS) + 1, "run the pass with more --prompts"),
    ):
        r["teachers"]["sets"][0]["answers"] = bad
        with pytest.raises(InvalidArgument, match=message):
            CrossVocabTeachers(r["teachers"], tokenizer_path=path, seed=3)


def test_a_set_of_several_passes_reads_their_records_in_order_and_refuses_another_teachers(tiny_pair, passed, tmp_path):
    from omnidraft.models.distill import CrossVocabTeachers

    drafter, target = tiny_pair
    path = drafter / "tokenizer.json"
    more = tmp_path / "more"
    S.teacher_pass(teacher=target, drafter=drafter, texts=TEXTS[:2], out=more, spec=SPEC, progress=False)
    one = store.load_teacher_set(passed, drafter_tokenizer_sha256=sha(drafter)).records
    extra = store.load_teacher_set(more, drafter_tokenizer_sha256=sha(drafter)).records
    r = cross_recipe(drafter, [{"shards": [str(passed), str(more)], "answers": len(TEXTS) + 1}])
    joined = CrossVocabTeachers(r["teachers"], tokenizer_path=path, seed=3).sets[0].records
    assert [x.ids.tolist() for x in joined] == [x.ids.tolist() for x in one + extra[:1]]

    other = tmp_path / "other-k"
    S.teacher_pass(teacher=target, drafter=drafter, texts=TEXTS[:2], out=other, spec=replace(SPEC, k=4), progress=False)
    for shards, message in (([str(passed), str(other)], "cannot extend"), ([], "a list of them"), ([3], "a list")):
        r["teachers"]["sets"][0]["shards"] = shards
        with pytest.raises(DataError, match=message):
            CrossVocabTeachers(r["teachers"], tokenizer_path=path, seed=3)


def test_a_teacher_temperature_sharpens_the_stored_distribution_and_a_bad_one_is_refused(tiny_pair, passed):
    """teachers.temperature T trains against p^(1/T), renormalised over the intersection: the
    sharpened top-K + tail, spread back over every intersection id, is that distribution computed
    densely, and the loss is the hybrid loss on it."""
    from omnidraft.adapt.loss import hybrid_loss, make_batch, sharpen
    from omnidraft.models.distill import CrossVocabTeachers

    drafter, _ = tiny_pair
    r = cross_recipe(drafter, [{"shards": str(passed)}], lm_weight=0.0)
    ts = CrossVocabTeachers(r["teachers"], tokenizer_path=drafter / "tokenizer.json", seed=0).sets[0]
    b = make_batch(ts.records[:2], "hybrid", ts.k)
    rows = b.dm_mask > 0
    n = len(ts.inter)

    def dense(logp, tail):
        out = tail.unsqueeze(-1).expand(-1, n).clone()
        return out.scatter(-1, b.topk_idx[rows], logp)

    before = dense(b.topk_logp[rows], b.tail[rows]).double()
    logp, tail = sharpen(b.topk_logp[rows], b.tail[rows], n, 0.5)
    after = dense(logp, tail).double()
    expected = torch.log_softmax(before / 0.5, dim=-1)
    assert torch.allclose(after, expected, atol=1e-4 * expected.abs().max().item())
    assert (after.argmax(-1) == before.argmax(-1)).all()
    assert (after.max(-1).values > before.max(-1).values - 1e-6).all()  # the top entry gains mass
    same = sharpen(b.topk_logp[rows], b.tail[rows], n, 1.0)
    assert torch.allclose(dense(*same).exp().sum(-1), torch.ones(int(rows.sum())), atol=1e-4)

    r["teachers"]["temperature"] = 0.5
    sharp = CrossVocabTeachers(r["teachers"], tokenizer_path=drafter / "tokenizer.json", seed=0)
    model = T.build_model(r)
    b = make_batch(sharp._records(0, 0), "hybrid", ts.k, seq_len=sharp.seq_len)
    rows = b.dm_mask > 0
    b.topk_logp[rows], b.tail[rows] = sharpen(b.topk_logp[rows], b.tail[rows], n, 0.5)
    with torch.no_grad():
        full = hybrid_loss(model(input_ids=b.ids).logits, torch.from_numpy(ts.inter), *b.inputs()[1:])
        assert sharp.loss(model, 0).item() == pytest.approx(full.item(), rel=1e-5)

    for bad in (0, -1.0, "cold", True):
        r["teachers"]["temperature"] = bad
        with pytest.raises(InvalidArgument, match="teachers.temperature"):
            CrossVocabTeachers(r["teachers"], tokenizer_path=drafter / "tokenizer.json", seed=0)


def test_the_forward_divergence_is_kl_from_the_dense_teacher_and_a_bad_one_is_refused(tiny_pair, passed):
    """teachers.divergence "forward" trains on KL(p || q') over the intersection, with p the stored
    top-K spread back over every intersection id (the tail's log p on the rest)."""
    from omnidraft.adapt.loss import hybrid_loss, make_batch
    from omnidraft.models.distill import CrossVocabTeachers

    drafter, _ = tiny_pair
    r = cross_recipe(drafter, [{"shards": str(passed)}], lm_weight=0.0)
    r["teachers"]["divergence"] = "forward"
    teachers = CrossVocabTeachers(r["teachers"], tokenizer_path=drafter / "tokenizer.json", seed=0)
    ts = teachers.sets[0]
    model = T.build_model(r)
    b = make_batch(teachers._records(0, 0), "dm", ts.k, seq_len=teachers.seq_len)
    inter = torch.from_numpy(ts.inter)
    with torch.no_grad():
        logits = model(input_ids=b.ids).logits
        loss = hybrid_loss(logits, inter, *b.inputs()[1:], divergence="forward")
        total = 0.0
        for i, j in zip(*torch.nonzero(b.dm_mask > 0, as_tuple=True)):
            log_p = torch.full((len(inter),), b.tail[i, j].item(), dtype=torch.float64)
            log_p[b.topk_idx[i, j]] = b.topk_logp[i, j].double()
            log_q = torch.log_softmax(logits[i, j, inter].double(), -1)
            total += (log_p.exp() * (log_p - log_q)).sum().item()
        assert loss.item() == pytest.approx(total / b.dm_mask.sum().item(), rel=1e-4)
        reverse = hybrid_loss(logits, inter, *b.inputs()[1:])
        assert loss.item() != pytest.approx(reverse.item(), rel=1e-3)

        # a head of every other token (the shipped recipe trains a cut head): the KL runs over the
        # kept part of the intersection, each top-K entry outside the head dropping out
        kept = torch.arange(0, model.config.vocab_size, 2)
        b = make_batch(teachers._records(0, 0), "hybrid", ts.k, seq_len=teachers.seq_len)
        want = dense_loss_on_a_cut_head(b, model(input_ids=b.ids).logits, ts.inter, kept, divergence="forward")
        assert teachers.loss(model, 0, kept).item() == pytest.approx(want, rel=1e-4)

    r["teachers"]["divergence"] = "sideways"
    with pytest.raises(InvalidArgument, match="teachers.divergence"):
        CrossVocabTeachers(r["teachers"], tokenizer_path=drafter / "tokenizer.json", seed=0)
