"""Argument fuzzing of every subcommand (hypothesis): whatever the arguments, the CLI answers with
argparse's usage error, a result, or one error line; never a traceback.

Options get hostile values: negative, huge, non-finite and non-numeric numbers, undecodable text,
FIFOs, folders, links to /dev/null, missing paths, garbage files, and valid tiny models and files so
that later checks are reached too. Where a command's real work would start (decoding, lowering,
training, a benchmark) it is replaced by raising ``Reached``: the arguments passed every check.
Examples are bounded and derandomized, so the run is fast and the same each time.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import io
import json
import os

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from omnidraft.cli import build_parser, main

EXAMPLES = 25


class Reached(BaseException):
    """The arguments passed every check; the command's real work would start here."""


def _reached(*a, **k):
    raise Reached


WORK = {  # (module, attribute path) where each command's real work starts
    "generate": [
        ("omnidraft.runtime.speculative", "_Run.speculative"),
        ("omnidraft.runtime.speculative", "_Run.target_only"),
    ],
    "export": [("omnidraft.export.hf_model", "load_model")],
    "exactness": [("omnidraft.bench.exactness", "check_pair")],
    "import-gguf": [("omnidraft.models.gguf_import", "_load")],
    "models": [("omnidraft.models.sources", "install")],  # fetching packages is the work
    "adapt": [("omnidraft.adapt.online", "OnlineAdapter.__init__")],
    "bench": [("omnidraft.bench.method_table", "run_bench")],
    "bench-adaptive": [("omnidraft.bench.adaptive_drafting", "AdaptiveBench.run")],
    "bench-export": [("omnidraft.bench.export_timing", "run_bench")],
    "demo": [("omnidraft.bench.demo", "run_demo")],
    "android-vectors": [
        ("omnidraft.android.vectors", name)
        for name in ("write_tokenizer_vectors", "write_loop_vectors", "write_pair_vectors")
    ],
    "streams": [("omnidraft.models.streams", "load_stream")],
    "vocab-map": [("omnidraft.runtime.vocab", "build_vocab_map")],
    "cache": [],
    "fleet": [
        ("omnidraft.fleet.simulate", "simulate"),
        ("omnidraft.fleet.deploy", "serve"),
        ("omnidraft.fleet.deploy", "join"),
    ],
}
PATHS = ("drafter", "target", "model", "out", "state", "cache", "stream", "file", "accept_head", "vocab_corpus")
COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)


def test_every_subcommand_is_fuzzed():
    assert sorted(WORK) == COMMANDS


@pytest.fixture(scope="module")
def pool(tmp_path_factory, tiny_pair, tiny_export):
    root = tmp_path_factory.mktemp("fuzz")
    fifo = root / "fifo"
    os.mkfifo(fifo)
    (root / "folder").mkdir()
    (root / "devnull").symlink_to("/dev/null")
    (root / "garbage.json").write_bytes(b"\xff\xfe{[")
    (root / "stream.jsonl").write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    (root / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    paths = [str(p) for p in (fifo, root / "folder", root / "devnull", root / "garbage.json", root / "deep.json")]
    paths += [str(root / "missing" / "x"), "", "\udcff\udcfe"]
    d, t = (str(p) for p in tiny_pair)
    good = {
        "drafter": [d],
        "target": [t, str(tiny_export[1])],
        "model": [str(tiny_export[0])],
        "stream": [str(root / "stream.jsonl"), "math"],
        "file": [str(root / "stream.jsonl")],
        "out": [str(root / "new-out")],
        "state": [str(root / "new-state")],
        "cache": [str(root / "new-cache.json")],
        "format": ["onnx"],
        "max_seq_len": ["64"],
        "prompt": ["def f(x):"],
        "name": ["gemma-3-270m"],
    }
    return {
        int: ["-1", "0", "1", "3", "64", "99999999999999999999", "nan", "x", ""],
        float: ["nan", "inf", "-inf", "-0.5", "0", "0.5", "1", "1e309", "x"],
        "path": paths + [v for vs in good.values() for v in vs],
        "good": good,
        str: ["", "\udcff", "math", "nope", "onnx", "int8", "auto", "none", "1,2", "-3", "nan", "gpt-2", *paths],
    }


def _patch_work(monkeypatch) -> None:
    for mod, attr in (x for targets in WORK.values() for x in targets):
        owner = importlib.import_module(mod)
        *outer, name = attr.split(".")
        for part in outer:
            owner = getattr(owner, part)
        monkeypatch.setattr(owner, name, _reached)
    from omnidraft.runtime import session

    monkeypatch.setattr(session, "load_model", functools.lru_cache(maxsize=None)(session.load_model))


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def _argv(draw, name: str, parser: argparse.ArgumentParser, pool: dict) -> list[str]:
    """Either every chosen option hostile half the time ("wild"), or all plausible but one (reaching
    the checks behind the first refusal: model loading, stream files, output folders)."""
    argv = [name]
    sub = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if sub:
        choice = draw(st.sampled_from([None, *sorted(sub[0].choices)]))
        return argv if choice is None else argv + _argv(draw, choice, sub[0].choices[choice], pool)
    options = _options(parser)
    wild = draw(st.booleans())
    odd = draw(st.sampled_from([a.dest for a in options]))
    for action in options:
        plausible = pool["good"].get(action.dest) or (
            [] if action.default in (None, False, True) else [str(action.default)]
        )
        if not action.required and not (
            draw(st.booleans()) if wild or action.dest == odd else plausible and draw(st.booleans())
        ):
            continue
        opt = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(opt)
            continue
        if action.choices:
            hostile = [*map(str, action.choices), "bogus"]
        elif action.type in (int, float):
            hostile = pool[action.type]
        else:
            hostile = pool["path"] if action.dest in PATHS else pool[str]
        hostile_now = action.dest == odd or not plausible or (wild and draw(st.booleans()))
        argv += [opt, draw(st.sampled_from(hostile if hostile_now else plausible))]
    return argv


def _run(argv: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except Reached:
            return "reached"
        except SystemExit as exc:  # argparse: a usage error (2) or --help (0)
            assert exc.code in (0, 2), (argv, exc.code)
            return "usage"
    text = err.getvalue()
    assert "Traceback" not in text, (argv, text)
    if code != 0:
        last = [line for line in text.splitlines() if line.strip()][-1]
        assert last.startswith(f"omnidraft {argv[0]}: error: ") and "\n" not in last, (argv, text)
    return f"rc {code}"


@pytest.mark.parametrize("name", COMMANDS)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_arguments_make_a_command_print_a_traceback(name, pool, monkeypatch, tmp_path_factory, data):
    monkeypatch.setenv("OMNIDRAFT_CACHE", str(tmp_path_factory.getbasetemp() / "fuzz-cache"))
    _patch_work(monkeypatch)
    parser = build_parser()._subparsers._group_actions[0].choices[name]
    argv = _argv(data.draw, name, parser, pool)
    note(f"{argv!r} -> {_run(argv)}")
