"""llama.cpp as the peer, through llama-cpp-python on the very GGUF file the target was converted
from: target-only greedy decoding and llama.cpp's prompt-lookup drafter (the drafting a llama.cpp
user has when no small model shares the target's vocabulary: llama.cpp removed cross-vocabulary
drafting in 2026).

llama-cpp-python is an optional extra (``pip install '.[peers]'``, built from its sdist with the
system compiler); without it the rows say so. Prompts are fed as the same token ids the omnidraft rows
use (the converted tokenizer is the GGUF's own vocabulary), and greedy means top-1 with no repeat
penalty, as in every other row.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

from omnidraft.bench.peers import PROMPT_LOOKUP_TOKENS, PeerRun

PEER_NAMES = ("llama.cpp-target-only", "llama.cpp-prompt-lookup")


# A build of llama.cpp for the CPU it is built on (GGML_NATIVE, the default) uses the AMX tile kernels
# where the CPU lists AMX, and on a VM that lists AMX their first matmul can segfault, which would take
# the whole bench with it. So its first decode runs in a child process before the peer loads in ours.
REBUILD = (
    "CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON "
    "-DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF' pip install --no-cache-dir --force-reinstall "
    "--no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36"
)
_PROBE = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_threads=int(sys.argv[2]), n_threads_batch=int(sys.argv[2]), verbose=False)
next(iter(llm.generate([0, 1], top_k=1, temp=0.0, reset=True)))
"""
_probed: dict[tuple[str, int], str | None] = {}

# ggml's log levels (ggml.h): llama-cpp-python 0.3.x maps them with an older numbering, so with
# verbose=False llama.cpp's warnings (WARN = 3 there, Gemma 3's "using full-size SWA cache" among
# them) still reach the bench's stderr, where the user can do nothing about them. Failures still
# surface: llama-cpp-python raises on them, and the child probe reports its stderr's last line.
_GGML_LOG_ERROR = 4
_log_callback = None  # kept alive: llama.cpp holds only the C pointer


def _quiet_llama_logs() -> None:
    global _log_callback
    if _log_callback is not None:
        return
    import ctypes
    import sys

    import llama_cpp

    if not hasattr(llama_cpp, "llama_log_set"):  # a build without the C API's logging hooks
        return

    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        if level == _GGML_LOG_ERROR:
            print(text.decode("utf-8", errors="replace"), end="", file=sys.stderr, flush=True)

    _log_callback = on_log
    llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))


def unavailable_reason(target_folder: Path, threads: int = 1) -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return "not installed (pip install '.[peers]': builds llama-cpp-python from its sdist, ~11 min on 2 cores)"
    gguf = gguf_of(target_folder)
    if gguf is None:
        return f"no GGUF file in {target_folder} (install the target with `omnidraft models install`)"
    key = (str(gguf), threads)
    if key not in _probed:
        _probed[key] = _probe(gguf, threads)
    return _probed[key]


def _probe(gguf: Path, threads: int) -> str | None:
    """Why llama.cpp cannot decode ``gguf`` here, from a first decode in a child process (None: it can)."""
    import signal
    import subprocess
    import sys

    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, str(gguf), str(threads)], capture_output=True, text=True, timeout=600
        )
    except subprocess.TimeoutExpired:
        return "failed: llama.cpp's first decode did not finish in 10 min"
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return f"failed: llama.cpp crashed ({name}) on its first decode on this CPU; rebuild it without AMX: {REBUILD}"
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"failed: llama.cpp could not decode {gguf.name} ({last[:200]})"
    return None


def gguf_of(folder: Path) -> Path | None:
    files = sorted(Path(folder).glob("*.gguf"))
    return files[0] if files else None


class LlamaCppPeers:
    """One llama.cpp context per peer row, loaded once, ``threads`` for decode and prompt batches."""

    def __init__(self, target_folder: Path, eos_ids: frozenset[int], *, threads: int, n_ctx: int) -> None:
        self.gguf = gguf_of(target_folder)
        self.eos = set(eos_ids)
        self.threads, self.n_ctx = threads, n_ctx
        self._models: dict[str, object] = {}

    def _model(self, name: str):
        if name not in self._models:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            _quiet_llama_logs()
            draft = LlamaPromptLookupDecoding(num_pred_tokens=PROMPT_LOOKUP_TOKENS) if "lookup" in name else None
            self._models[name] = Llama(
                model_path=str(self.gguf),
                n_ctx=self.n_ctx,
                n_threads=self.threads,
                n_threads_batch=self.threads,
                draft_model=draft,
                verbose=False,
            )
        return self._models[name]

    @staticmethod
    def kernels() -> str:
        """The instruction sets this llama.cpp build uses (its system info, the flags set to 1)."""
        from llama_cpp import llama_print_system_info

        info = llama_print_system_info().decode(errors="replace")
        # "CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 0 | ..." -> "SSE3 AVX2"
        return " ".join(f.split("=")[0].split(":")[-1].strip() for f in info.split("|") if f.strip().endswith("= 1"))

    def generate(self, name: str, ids: list[int], max_new_tokens: int) -> list[int]:
        llm = self._model(name)
        out: list[int] = []
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            if tok in self.eos or len(out) >= max_new_tokens:
                break
        return out

    def job(self, name: str, prompt_ids: list[list[int]], max_new_tokens: int):
        """An interleavable job (bench.engine.Job); one untimed warm-up call happens here."""
        from omnidraft.bench.engine import Job

        run = PeerRun(name, {"threads": self.threads, "gguf": self.gguf.name, "kernels": self.kernels()})
        self.generate(name, prompt_ids[0], min(8, max_new_tokens))

        def step(i: int) -> None:
            t0 = time.perf_counter()
            out = self.generate(name, prompt_ids[i], max_new_tokens)
            run.seconds += time.perf_counter() - t0
            run.outputs.append(out)
            run.new_tokens += len(out)
            run.prompts += 1

        return Job(name, step, run)
