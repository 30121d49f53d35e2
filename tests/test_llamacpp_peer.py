"""The llama.cpp bench peer: rows that say why when llama-cpp-python or the GGUF file is missing, and
the generation loop (prompt ids in, greedy settings, stop at EOS or the token budget) against a stand-in
for llama_cpp, so the wiring is tested without building llama.cpp."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace

from omnidraft.bench import llamacpp_peer, peer_section
from omnidraft.bench.engine import interleave


def _bench(target: Path) -> SimpleNamespace:
    return SimpleNamespace(
        s=SimpleNamespace(peers=("llama.cpp",), threads=1, max_seq_len=64, max_new_tokens=5, backend="ort"),
        pair=SimpleNamespace(target=target),
        report={"rows": [], "peers": []},
        llamacpp=None,
    )


def test_rows_say_why_llama_cpp_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    bench = _bench(tmp_path)
    peer_section.run_peers(bench, SimpleNamespace(name="code", prompts=["def f():"]))
    rows = bench.report["peers"]
    assert [r["name"] for r in rows] == list(llamacpp_peer.PEER_NAMES)
    assert all(r["status"].startswith("not installed") and r["tokens_per_s"] is None for r in rows)


def test_a_target_without_its_gguf_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", types.ModuleType("llama_cpp"))
    monkeypatch.setattr(llamacpp_peer.importlib.util, "find_spec", lambda name: object())
    why = llamacpp_peer.unavailable_reason(tmp_path)
    assert why is not None and "no GGUF file" in why and "omnidraft models install" in why


class _FakeLlama:
    """Greedy 'model': each next token is the last one plus one; records how it was called."""

    made: list[dict] = []

    def __init__(self, **kw) -> None:
        _FakeLlama.made.append(kw)

    def generate(self, ids, **kw):
        assert kw["temp"] == 0.0 and kw["top_k"] == 1 and kw["repeat_penalty"] == 1.0 and kw["reset"]
        t = ids[-1]
        while True:
            t += 1
            yield t


def test_jobs_feed_the_prompt_ids_and_stop_at_eos_or_the_budget(tmp_path, monkeypatch):
    fake = types.ModuleType("llama_cpp")
    fake.Llama = _FakeLlama
    fake.llama_print_system_info = lambda: b"CPU : AVX2 = 1 | AMX_INT8 = 0 | AVX512 = 1 | "
    spec = types.ModuleType("llama_cpp.llama_speculative")
    spec.LlamaPromptLookupDecoding = lambda num_pred_tokens: ("lookup", num_pred_tokens)
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", spec)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    _FakeLlama.made.clear()
    peers = llamacpp_peer.LlamaCppPeers(tmp_path, frozenset({13}), threads=2, n_ctx=64)
    jobs = [peers.job(name, [[1, 2, 3], [20]], max_new_tokens=5) for name in llamacpp_peer.PEER_NAMES]
    runs = interleave(jobs, 2, "test", progress=False)
    for name in llamacpp_peer.PEER_NAMES:
        assert runs[name].outputs == [[4, 5, 6, 7, 8], [21, 22, 23, 24, 25]]
        assert runs[name].config["kernels"] == "AVX2 AVX512"
    assert peers.generate(llamacpp_peer.PEER_NAMES[0], [9], 10) == [10, 11, 12, 13]  # EOS 13 ends it
    made = {bool(kw["draft_model"]): kw for kw in _FakeLlama.made}
    assert made[True]["draft_model"] == ("lookup", llamacpp_peer.PROMPT_LOOKUP_TOKENS)
    assert all(kw["n_threads"] == kw["n_threads_batch"] == 2 and kw["n_ctx"] == 64 for kw in made.values())
    assert all(kw["model_path"].endswith("m.gguf") for kw in made.values())


def test_a_llama_cpp_build_that_crashes_is_a_row_not_a_dead_bench(tmp_path, monkeypatch):
    """llama.cpp's first decode runs in a child process: a native crash there (an AMX build on a VM
    that lists AMX segfaults in its first matmul) becomes the rows' status, with the rebuild command,
    and the bench goes on; a build that decodes is loaded in-process as before."""
    monkeypatch.setattr(llamacpp_peer.importlib.util, "find_spec", lambda name: object())
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(llamacpp_peer, "_probed", {})
    monkeypatch.setattr(llamacpp_peer, "_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    why = llamacpp_peer.unavailable_reason(tmp_path, threads=1)
    assert why.startswith("failed: llama.cpp crashed (SIGSEGV)") and "-DGGML_AMX_TILE=OFF" in why
    monkeypatch.setattr(llamacpp_peer, "_PROBE", "raise SystemExit('unknown model architecture')")
    assert "unknown model architecture" in llamacpp_peer.unavailable_reason(tmp_path, threads=2)
    assert llamacpp_peer.unavailable_reason(tmp_path, threads=1) == why  # probed once per file and threads
    monkeypatch.setattr(llamacpp_peer, "_PROBE", "pass")
    assert llamacpp_peer.unavailable_reason(tmp_path, threads=4) is None
