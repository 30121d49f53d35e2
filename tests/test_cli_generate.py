"""`omnidraft generate`: JSON output and one-line refusals of bad input (no tracebacks)."""

from __future__ import annotations

import json
import shutil

import pytest
from tiny_models import make_tiny_model

from omnidraft.cli import main


@pytest.fixture(scope="module")
def pair(make_tiny_pair):
    return make_tiny_pair(64)


def run(capsys, *argv):
    code = main(["generate", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_output_has_the_documented_fields(pair, capsys, tmp_path):
    d, t = pair
    code, out, err = run(
        capsys,
        "--drafter",
        d,
        "--target",
        t,
        "--prompt",
        "def f(x):",
        "--max-new-tokens",
        8,
        "--json",
        "--cache",
        tmp_path / "c.json",
    )
    assert code == 0
    doc = json.loads(out)
    for key in (
        "text",
        "token_ids",
        "steps",
        "proposed",
        "accepted",
        "acceptance_rate",
        "tokens_per_step",
        "ngram_hits",
        "new_tokens",
        "seconds",
    ):
        assert key in doc
    assert doc["new_tokens"] == len(doc["token_ids"]) == 8
    assert (tmp_path / "c.json").is_file()
    code, out2, _ = run(
        capsys,
        "--drafter",
        d,
        "--target",
        t,
        "--prompt",
        "def f(x):",
        "--max-new-tokens",
        8,
        "--json",
        "--mode",
        "target-only",
    )
    assert json.loads(out2)["token_ids"] == doc["token_ids"]


def _refused(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]


def test_bad_inputs_get_one_clear_line(pair, capsys, tmp_path):
    d, t = pair
    base = ["--drafter", d, "--target", t]
    no_tok = tmp_path / "no_tok"
    shutil.copytree(t, no_tok)
    (no_tok / "tokenizer.json").unlink()
    incomplete = tmp_path / "incomplete"
    incomplete.mkdir()
    (incomplete / "config.json").write_text("{}")
    _refused(capsys, ["--drafter", d, "--target", tmp_path / "nope", "--prompt", "x"], "does not exist")
    _refused(capsys, ["--drafter", d, "--target", no_tok, "--prompt", "x"], "missing tokenizer.json")
    _refused(
        capsys, ["--drafter", d, "--target", incomplete, "--prompt", "x"], "missing tokenizer.json, model.safetensors"
    )
    _refused(capsys, [*base, "--prompt", ""], "prompt is empty")
    _refused(capsys, [*base, "--prompt", "word " * 80], "shorten the prompt")
    _refused(capsys, [*base, "--prompt", "x", "--temperature", "-0.5"], "temperature must be >= 0")
    _refused(capsys, [*base, "--prompt", "x", "--draft-len", "0"], "K must be >= 1")
    _refused(capsys, [*base, "--prompt", "x", "--mode", "fast"], "unknown mode 'fast'")
    _refused(capsys, [*base, "--prompt", "x", "--lookup", "-1"], "0 turns the context lookup off")
    _refused(capsys, [*base, "--prompt", "x", "--lookup-ngram", "4-2"], "1 <= MIN <= MAX")
    _refused(capsys, [*base, "--prompt", "x", "--lookup-ngram", "two"], "such as 2-4")


def test_foreign_or_corrupted_cache_is_refused(pair, capsys, tmp_path, tokenizer_path):
    d, t = pair
    other = make_tiny_model(tmp_path / "other", "qwen2", tokenizer_path("qwen2"), seed=3, max_pos=64)
    cache = tmp_path / "c.json"
    assert (
        run(
            capsys,
            "--drafter",
            d,
            "--target",
            other,
            "--prompt",
            "hello",
            "--max-new-tokens",
            4,
            "--cache",
            cache,
            "--json",
        )[0]
        == 0
    )
    _refused(capsys, ["--drafter", d, "--target", t, "--prompt", "hello", "--cache", cache], "another drafter/target")
    cache.write_bytes(cache.read_bytes()[:-7])
    _refused(capsys, ["--drafter", d, "--target", other, "--prompt", "hello", "--cache", cache], "n-gram cache")
