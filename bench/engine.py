"""One backend's loaded drafter/target pair, and interleaved timing of several decoders.

The machine is shared and its load drifts, so runs that are compared with each other are timed in
lockstep: for every prompt, every job decodes it once (the job order rotates from prompt to prompt).
A drift then slows all of them alike instead of whichever row happened to run during it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from omnidraft.bench.bundled import DRAFT_VOCAB, check_bundled, drafter_export, target_export
from omnidraft.bench.demo import BACKENDS, DRAFTER_DEVICES
from omnidraft.bench.streams_eval import StreamRun
from omnidraft.errors import InvalidArgument
from omnidraft.native_output import without_native_lines
from omnidraft.runtime.answer_memory import AnswerMemory
from omnidraft.runtime.backends.base import DRAFTER_THREADS
from omnidraft.runtime.context_lookup import LookupConfig
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.loader import LoadedModel, check_hf_folder, load_model
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import SpeculativeDecoder


@dataclass
class Pair:
    """The drafter and target as Hugging Face folders (exports are derived from them per backend)."""

    drafter: Path
    target: Path
    name: str

    def paths(
        self,
        backend: str,
        max_seq_len: int,
        progress: bool = True,
        draft_vocab: int | None = DRAFT_VOCAB,
        target_quant: str | None = None,
    ) -> tuple[Path, Path]:
        """The backend's exports of both models; ``target_quant`` overrides the backend's quant for
        the target (an int4 ONNX target, say: its step is the one every speedup divides)."""
        fmt, quant = BACKENDS[backend]
        if fmt is None:
            return self.drafter, self.target
        device = DRAFTER_DEVICES.get(backend, "cpu")
        return (
            drafter_export(self.drafter, fmt, quant, max_seq_len, progress, draft_vocab=draft_vocab, device=device),
            target_export(self.target, fmt, target_quant or quant, max_seq_len, progress),
        )


def resolve_pair(spec: str) -> Pair:
    """``bundled`` (alias ``tiny``) or ``DRAFTER,TARGET``: each a Hugging Face model folder, a .gguf
    file or a model name from ``omnidraft models list``."""
    from omnidraft.models.sources import resolve

    if spec in ("bundled", "tiny"):
        f = check_bundled()
        return Pair(f["drafter"], f["target"], "bundled")
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) != 2 or not all(parts):
        raise InvalidArgument(
            f"unknown pair {spec!r}; use 'bundled' or 'DRAFTER,TARGET' (model folders, .gguf files or model names)"
        )
    folders = [resolve(p) for p in parts]
    for p in folders:
        check_hf_folder(p)
    return Pair(folders[0], folders[1], spec)


@dataclass
class Job:
    """One decoder configuration inside an interleaved group; ``step(i)`` decodes prompt i."""

    name: str
    step: Callable[[int], None]
    result: object  # StreamRun (omnidraft) or PeerRun (Hugging Face)
    decoder: SpeculativeDecoder | None = None


def interleave(jobs: list[Job], n: int, desc: str, progress: bool = True) -> dict[str, object]:
    """Run every job on prompts 0..n-1 in lockstep; a Ctrl-C propagates (the group is dropped)."""
    bar = tqdm(range(n), desc=desc, file=sys.stderr, disable=not progress, leave=False, dynamic_ncols=True)
    try:
        for i in bar:
            r = i % len(jobs)
            for job in jobs[r:] + jobs[:r]:
                job.step(i)
    finally:
        bar.close()
    return {j.name: j.result for j in jobs}


def adaptation_pass(adapter, prompts: list[str], desc: str, progress: bool = True):
    """One online adaptation pass (``OnlineAdapter.run``) over ``prompts`` behind a progress bar."""
    bar = tqdm(total=len(prompts), desc=desc, file=sys.stderr, disable=not progress, leave=False, dynamic_ncols=True)
    try:
        return adapter.run(prompts, lambda i, rec: bar.update(1))
    finally:
        bar.close()


def set_threads(n: int | None) -> dict:
    """Intra-op threads for torch (ONNX Runtime sessions and ExecuTorch's threadpool get theirs when
    an engine of that backend loads). On a small shared machine spinning thread pools cost far more
    than they bring: under load, tiny models decode several times faster on one thread."""
    import torch

    if n:
        torch.set_num_threads(n)
    return {"torch": torch.get_num_threads()}


def _executorch_threads(n: int | None) -> int | None:
    from executorch.extension.pybindings import portable_lib as pl

    if n and hasattr(pl, "_unsafe_reset_threadpool"):
        with without_native_lines():  # a new threadpool probes the CPU, and cpuinfo prints each probe
            pl._unsafe_reset_threadpool(n)
    return pl._threadpool_get_thread_count() if hasattr(pl, "_threadpool_get_thread_count") else None


def load(path: Path, threads: int | None = None, spin: bool = False) -> LoadedModel:
    """``load_model``, with ``threads`` intra-op threads for an ONNX Runtime session."""
    return load_model(path, threads=threads or None, spin=spin)


def load_drafter(path: Path) -> LoadedModel:
    """A drafter: its ONNX Runtime session runs on one thread (runtime/backends/base.py)."""
    return load_model(path, threads=DRAFTER_THREADS)


class Engine:
    """Drafter and target loaded once for one backend; every run gets its own decoder and cache."""

    def __init__(
        self, backend: str, drafter_path: Path, target_path: Path, threads: int | None = None, splits: bool = True
    ) -> None:
        self.backend = backend
        self.splits = splits  # ngram-mode greedy runs may propose split drafter tokens (runtime/vocab.py)
        self.threads = threads
        self.executorch_threads = _executorch_threads(threads) if backend == "executorch" else None
        self.drafter = load_drafter(drafter_path)
        # Its pool may spin beside a one-thread ONNX Runtime drafter (runtime/backends/ort.py).
        self.target = load(target_path, threads, spin=self.drafter.source == "onnx")
        self.paths = (drafter_path, target_path)

    @property
    def cache_args(self) -> tuple:
        return (self.drafter.codec.sha256, self.target.codec.sha256, self.drafter.backend.vocab_size)

    def new_cache(self, capacity: int | None = None, policy: str = "lfu") -> NgramCache:
        return NgramCache(*self.cache_args, capacity=capacity, policy=policy)

    def load_cache(self, path: Path) -> NgramCache:
        return NgramCache.load(path, *self.cache_args, self.target.backend.vocab_size)

    def decoder(
        self, cache: NgramCache | None = None, drafter: LoadedModel | None = None, memory: AnswerMemory | None = None
    ) -> SpeculativeDecoder:
        # A fresh decoder per job: its draft mask is keyed on the cache it was built with.
        return SpeculativeDecoder(
            self.target, drafter or self.drafter, cache if cache is not None else self.new_cache(), memory=memory
        )

    def new_memory(self) -> AnswerMemory:
        return AnswerMemory(self.target.codec.sha256)

    def load_memory(self, path: Path) -> AnswerMemory:
        return AnswerMemory.load(path, self.target.codec.sha256, self.target.backend.vocab_size)

    def warm_up(self, prompt: str, drafter: LoadedModel | None = None) -> None:
        """One short untimed decode per mode (on a throwaway cache), so first-call costs (allocations,
        kernel selection) are not charged to whichever job happens to run first."""
        dec = self.decoder(drafter=drafter)
        for mode in ("target-only", "dm", "ngram"):
            dec.generate(prompt, DecodeConfig(max_new_tokens=4, draft_len=2, mode=mode, splits=self.splits))

    def job(
        self,
        name: str,
        prompts: list[str],
        mode: str,
        draft_len: int | str,
        max_new_tokens: int,
        *,
        cache: NgramCache | None = None,
        on_verified=None,
        drafter: LoadedModel | None = None,
        gamma: float = 0.5,
        tune=None,
        on_result=None,
        max_draft_len: int = 16,
        lookup: LookupConfig | None = None,
        memory: AnswerMemory | None = None,
    ) -> Job:
        """``draft_len`` "auto": adaptive drafting at ``gamma``, or tuned per prompt by ``tune`` (a
        runtime.gamma.GammaController, fed each traced prompt); ``on_result`` gets each traced
        DecodeResult (calibration); ``memory`` learns every answer of the job (and proposes with ``lookup``)."""
        dec = self.decoder(cache, drafter, memory)
        cfg = DecodeConfig(
            max_new_tokens=max_new_tokens,
            draft_len=draft_len,
            mode=mode,
            splits=self.splits,
            gamma=gamma,
            max_draft_len=max_draft_len,
            lookup=lookup,
        )
        if tune is not None:
            tune.configure(cfg)
        run = StreamRun(name, mode, draft_len)

        def step(i: int) -> None:
            out = dec.generate(
                prompts[i], cfg, on_verified=on_verified, trace=on_result is not None or tune is not None
            )
            if tune is not None:
                # The controller's replay is part of this row's cost (about 1 % of decode time at most).
                t0 = time.perf_counter()
                tune.observe(out)
                tune.configure(cfg)
                out.stats.seconds += time.perf_counter() - t0
            run.stats += out.stats
            run.prompts += 1
            run.outputs.append(out.token_ids)
            run.running_acceptance.append(run.stats.acceptance_rate)
            if on_result is not None:
                on_result(out)

        return Job(name, step, run, dec)

    def run(
        self,
        prompts: list[str],
        mode: str,
        draft_len: int,
        max_new_tokens: int,
        label: str,
        cache: NgramCache | None = None,
        on_verified=None,
        progress: bool = True,
        drafter: LoadedModel | None = None,
        memory: AnswerMemory | None = None,
    ) -> StreamRun:
        """A single job over ``prompts`` (a pass that fills a cache and a memory, not a timed comparison)."""
        job = self.job(
            label,
            prompts,
            mode,
            draft_len,
            max_new_tokens,
            cache=cache,
            on_verified=on_verified,
            drafter=drafter,
            memory=memory,
        )
        return interleave([job], len(prompts), label, progress)[label]

    def fits(self, prompt: str, max_new_tokens: int, k_max: int) -> bool:
        """The prompt leaves room for the generation and the longest draft in both KV caches."""
        t = len(self.target.codec.start_ids) + len(self.target.codec.encode(prompt))
        d = len(self.drafter.codec.start_ids) + len(self.drafter.codec.encode(prompt))
        return (
            t + max_new_tokens + k_max + 1 <= self.target.backend.max_seq_len
            and d + 2 * max_new_tokens + k_max + 1 <= self.drafter.backend.max_seq_len
        )
