"""The Android core's committed vectors must be what the current Python runtime produces.

If one of these fails after a change to runtime/ or the tokenizer converter, run
`omnidraft android-vectors` and then `bash android_demo/ci/test_core.sh` to see whether the Java
core still matches (it replays the vectors exactly).
"""

from __future__ import annotations

import json

from omnidraft.android import vectors as av


def _load(path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_tokenizer_vectors_are_current(tmp_path, tokenizer_path):
    tokenizer_path("llama-spm")
    for path in av.write_tokenizer_vectors(tmp_path):
        committed = av.VECTOR_DIR / path.name
        assert committed.is_file(), f"{committed} missing: run `omnidraft android-vectors`"
        assert _load(path) == _load(committed), f"{path.name} is stale: run `omnidraft android-vectors`"


def test_loop_vectors_are_current_and_cover_the_rule(tmp_path, tokenizer_path):
    tokenizer_path("llama-spm")
    fresh = _load(av.write_loop_vectors(tmp_path))
    committed = _load(av.VECTOR_DIR / "loop-llama-spm-gpt-2.json")
    assert fresh == committed, "loop vectors are stale: run `omnidraft android-vectors`"
    runs = fresh["runs"]
    sampling = [r for r in runs if r["config"]["temperature"] > 0 and r["config"]["mode"] != "target-only"]
    assert sampling and all(r["uniforms"] for r in sampling)
    assert sum(r["stats"]["ngram_hits"] for r in runs) > 0
    assert any(rd["accepted"] < len(rd["target_ids"]) for r in sampling for rd in r["rounds"])
    assert fresh["qprime_cases"], "no Eq. 2 cases"
