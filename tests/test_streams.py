"""Task streams: sizes, determinism, held-out discipline, and bad input."""

import json

import pytest

from omnidraft.errors import DataError
from omnidraft.models import data, streams


@pytest.fixture(scope="module", params=streams.STREAMS)
def name(request):
    return request.param


def test_sizes_and_determinism(name):
    train, test = streams.load_stream(name, "train"), streams.load_stream(name, "test")
    assert len(train) >= 500 and len(test) >= 50
    assert [p.id for p in train] == [p.id for p in streams.load_stream(name)]
    assert len({p.id for p in train + test}) == len(train) + len(test)
    assert all(p.stream == name and p.prompt and p.reference for p in train + test)


def test_test_split_disjoint_from_train(name):
    train = {p.prompt for p in streams.load_stream(name, "train")}
    assert not train & {p.prompt for p in streams.load_stream(name, "test")}


def test_the_training_pool_extends_the_train_split_with_new_training_prompts_only(name):
    train = streams.load_stream(name, "train")
    pool = streams.train_pool(name, len(train) + 600)
    assert len(pool) == len(train) + 600 and pool[: len(train)] == train
    assert streams.train_pool(name, 10) == train[:10]
    prompts = [p.prompt for p in pool]
    assert len(set(prompts[len(train) :])) == 600 and not set(prompts[len(train) :]) & set(prompts[: len(train)])
    assert not set(prompts) & {p.prompt for p in streams.load_stream(name, "test")}
    assert [p.id for p in streams.train_pool(name, len(train) + 600)] == [p.id for p in pool]


def test_test_prompts_come_from_heldout_documents():
    for p in streams.load_stream("code", "test"):
        doc_id = p.id.split("/", 1)[1].rsplit(":", 2)[0] if "stdlib:" in p.id else "humaneval:" + p.id.split("/", 1)[1]
        assert data.is_heldout(doc_id), p.id
    for p in streams.load_stream("text", "test"):
        assert data.is_heldout(p.id.split("/", 1)[1].rsplit("@", 1)[0]), p.id


def test_training_data_excludes_test_material():
    code_train = {d.id for d in data.train_documents("code")}
    text_train = {d.id for d in data.train_documents("text")}
    assert not any(data.is_heldout(i) for i in code_train | text_train)
    assert "shakespeare:hamlet" not in text_train and "shakespeare:lear" in text_train
    test_q = {p.prompt for p in streams.load_stream("math", "test")}
    train_q = {f"Question: {p.question}\nAnswer:" for p in streams.math_training_problems(3000)}
    assert not test_q & train_q


def test_prompt_shapes():
    assert all(
        p.prompt.startswith("Question: ") and p.prompt.endswith("\nAnswer:")
        for p in streams.load_stream("math", "test")
    )
    assert all(p.reference.rstrip().splitlines()[-1].startswith("#### ") for p in streams.load_stream("math", "test"))
    assert all(
        p.prompt.lstrip().startswith(("def ", "async def ", "from ", "import ", "\n")) or "def " in p.prompt
        for p in streams.load_stream("code", "test")
    )


def test_unknown_stream_lists_valid_names():
    with pytest.raises(DataError, match="code, math, text"):
        streams.load_stream("poetry")
    with pytest.raises(DataError, match="train, test"):
        streams.load_stream("code", "dev")


def test_stream_file(tmp_path):
    f = tmp_path / "s.jsonl"
    f.write_text(
        json.dumps({"prompt": "Hello"}) + "\n\n" + json.dumps({"prompt": "def f():", "reference": "  pass"}) + "\n"
    )
    ps = streams.load_stream_file(f)
    assert [p.prompt for p in ps] == ["Hello", "def f():"] and ps[1].reference == "  pass"


@pytest.mark.parametrize(
    "content, match",
    [
        ("", "empty"),
        ('{"prompt": "ok"}\n{not json}\n', "line 2"),
        ('{"prompt": "ok"}\n{"text": "no prompt"}\n', "line 2"),
        ('["prompt"]\n', "line 1"),
    ],
)
def test_bad_stream_files(tmp_path, content, match):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(DataError, match=match):
        streams.load_stream_file(f)


def test_missing_stream_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        streams.load_stream_file(tmp_path / "nope.jsonl")


def test_cli_lists_and_rejects(capsys):
    from omnidraft.cli import main

    assert main(["streams", "--stream", "math", "--split", "test"]) == 0
    assert "| math | test | 100 |" in capsys.readouterr().out
    assert main(["streams", "--stream", "poems"]) == 1
    err = capsys.readouterr().err
    assert "unknown stream 'poems'" in err and "code, math, text" in err and "Traceback" not in err
