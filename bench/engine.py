"""One backend's loaded drafter/target pair, and the decoding runs the bench makes with it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omnidraft.bench.bundled import cached_export, check_bundled
from omnidraft.bench.demo import BACKENDS
from omnidraft.bench.streams_eval import StreamRun, run_stream
from omnidraft.errors import InvalidArgument
from omnidraft.runtime.loader import check_hf_folder, load_model
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import DecodeConfig, SpeculativeDecoder


@dataclass
class Pair:
    """The drafter and target as Hugging Face folders (exports are derived from them per backend)."""

    drafter: Path
    target: Path
    name: str

    def paths(self, backend: str, max_seq_len: int, progress: bool = True) -> tuple[Path, Path]:
        fmt, quant = BACKENDS[backend]
        if fmt is None:
            return self.drafter, self.target
        return (cached_export(self.drafter, fmt, quant, max_seq_len, progress),
                cached_export(self.target, fmt, quant, max_seq_len, progress))


def resolve_pair(spec: str) -> Pair:
    """``bundled`` or ``DRAFTER,TARGET`` (two Hugging Face model folders)."""
    if spec == "bundled":
        f = check_bundled()
        return Pair(f["drafter"], f["target"], "bundled")
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) != 2 or not all(parts):
        raise InvalidArgument(f"unknown pair {spec!r}; use 'bundled' or 'DRAFTER,TARGET' (two Hugging Face model folders)")
    for p in parts:
        check_hf_folder(Path(p))
    return Pair(Path(parts[0]), Path(parts[1]), spec)


class Engine:
    """Drafter and target loaded once for one backend; every run gets its own decoder and cache."""

    def __init__(self, backend: str, drafter_path: Path, target_path: Path) -> None:
        self.backend = backend
        self.drafter = load_model(drafter_path)
        self.target = load_model(target_path)
        self.paths = (drafter_path, target_path)

    @property
    def cache_args(self) -> tuple:
        return (self.drafter.codec.sha256, self.target.codec.sha256, self.drafter.backend.vocab_size)

    def new_cache(self, capacity: int | None = None, policy: str = "lfu") -> NgramCache:
        return NgramCache(*self.cache_args, capacity=capacity, policy=policy)

    def load_cache(self, path: Path) -> NgramCache:
        return NgramCache.load(path, *self.cache_args, self.target.backend.vocab_size)

    def decoder(self, cache: NgramCache | None = None, drafter=None) -> SpeculativeDecoder:
        # A fresh decoder per run: its draft mask is keyed on the cache it was built with.
        return SpeculativeDecoder(self.target, drafter or self.drafter, cache if cache is not None else self.new_cache())

    def warm_up(self, prompt: str) -> None:
        """One short untimed decode per mode, so first-call costs (allocations, kernel selection) are
        not charged to whichever row happens to run first."""
        dec = self.decoder()
        for mode in ("target-only", "dm", "ngram"):
            dec.generate(prompt, DecodeConfig(max_new_tokens=4, draft_len=2, mode=mode))

    def run(self, prompts: list[str], mode: str, draft_len: int, max_new_tokens: int, label: str,
            cache: NgramCache | None = None, on_verified=None, progress: bool = True,
            drafter=None) -> tuple[StreamRun, SpeculativeDecoder]:
        """Decode ``prompts``; a Ctrl-C inside discards the partial run by re-raising."""
        dec = self.decoder(cache, drafter)
        cfg = DecodeConfig(max_new_tokens=max_new_tokens, draft_len=draft_len, mode=mode)
        run = run_stream(dec, prompts, cfg, label, progress, on_verified=on_verified)
        if run.interrupted:
            raise KeyboardInterrupt
        return run, dec

    def fits(self, prompt: str, max_new_tokens: int, k_max: int) -> bool:
        """The prompt leaves room for the generation and the longest draft in both KV caches."""
        t = len(self.target.codec.start_ids) + len(self.target.codec.encode(prompt))
        d = len(self.drafter.codec.start_ids) + len(self.drafter.codec.encode(prompt))
        return (t + max_new_tokens + k_max + 1 <= self.target.backend.max_seq_len
                and d + 2 * max_new_tokens + k_max + 1 <= self.drafter.backend.max_seq_len)
