"""Open a drafter/target pair with its n-gram cache and answer memory: the one place the CLI, demo and
bench do this."""

from __future__ import annotations

import sys
from pathlib import Path

from omnidraft.atomic import check_writable
from omnidraft.runtime.answer_memory import AnswerMemory
from omnidraft.runtime.backends.base import DRAFTER_THREADS
from omnidraft.runtime.loader import LoadedModel, load_model
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.ngram_cache_file import open_shared
from omnidraft.runtime.speculative import SpeculativeDecoder


def open_pair(
    target: Path,
    drafter: Path | None,
    cache_path: Path | None = None,
    cache_capacity: int | None = None,
    policy: str = "lfu",
    accept_head: Path | None = None,
    *,
    memory_path: Path | None = None,
) -> SpeculativeDecoder:
    """``memory_path``: the answer memory's file, loaded when it exists (else a new memory); without it
    the decoder has none."""
    if cache_path is not None and drafter is not None:
        check_writable(cache_path)  # a cache that could not be saved is refused before any decoding
    if memory_path is not None:
        check_writable(memory_path)
    drf = None if drafter is None else load_model(drafter, accept_head=accept_head, threads=DRAFTER_THREADS)
    # The target's pool may spin while a one-thread ONNX Runtime drafter (or nothing) runs beside it.
    tgt = load_model(target, spin=drf is None or drf.source == "onnx")
    memory = None if memory_path is None else open_memory(memory_path, tgt)
    if drf is None:
        return SpeculativeDecoder(tgt, memory=memory)
    if tgt.info.get("row_stable") is False:
        print(
            f"note: the target {target} is not row-stable (its manifest's parity.batch_invariance): "
            "speculative greedy output can differ from target-only at near-tied tokens; for exact output "
            "re-export it with --format onnx, or --et-path static or --quant fp32 for a .pte",
            file=sys.stderr,
        )
    args = (drf.codec.sha256, tgt.codec.sha256, drf.backend.vocab_size)
    if cache_path is not None:
        cache = open_shared(Path(cache_path), *args, tgt.backend.vocab_size, capacity=cache_capacity, policy=policy)
    else:
        cache = NgramCache(*args, capacity=cache_capacity, policy=policy)
    return SpeculativeDecoder(tgt, drf, cache, memory=memory)


def open_memory(path: Path, target: LoadedModel) -> AnswerMemory:
    """The answer memory saved at ``path`` for ``target``'s tokenizer, or a new one if there is none yet."""
    if Path(path).exists():
        return AnswerMemory.load(path, target.codec.sha256, target.backend.vocab_size)
    return AnswerMemory(target.codec.sha256)


def save_cache(cache: NgramCache, path: Path) -> None:
    cache.save(path)
