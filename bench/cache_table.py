"""The n-gram cache's size, measured (paper Table 4), its growth over a stream (paper Fig. 9), and
capped caches against the uncapped one (paper Table 14).

Bytes are measured two ways, never estimated: the serialised file (what is saved and shipped) and
the live Python object, by tracing every allocation made while an identical cache is rebuilt from
that file (tracemalloc; numpy reports its buffers to it too).
"""

from __future__ import annotations

import gc
import tempfile
import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING

from omnidraft.runtime.ngram_cache import NgramCache

if TYPE_CHECKING:
    from omnidraft.bench.engine import Engine


def _traced_load(path: Path, args: tuple, target_width: int) -> int:
    """Bytes still allocated after loading the cache saved at ``path``."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        obj = NgramCache.load(path, *args, target_width)
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    del obj
    return used


def measure_cache(cache: NgramCache, target_width: int) -> dict:
    """Entries, serialised bytes and in-memory bytes of ``cache``."""
    args = (cache.drafter_tokenizer, cache.target_tokenizer, len(cache.drafter_tokens))
    with tempfile.TemporaryDirectory(prefix="omnidraft-bench-cache-") as tmp:
        path, blank = Path(tmp) / "cache.json", Path(tmp) / "empty.json"
        cache.save(path)
        NgramCache(*args).save(blank)
        file_bytes = path.stat().st_size
        _traced_load(blank, args, target_width)  # untraced-equivalent warm-up: first-use allocations
        # Both through the same load path, median of three: one-off interpreter allocations inside the
        # traced window otherwise show up as a few hundred bytes of noise.
        memory = sorted(_traced_load(path, args, target_width) for _ in range(3))[1]
        empty = sorted(_traced_load(blank, args, target_width) for _ in range(3))[1]
    n = len(cache)
    lengths = [len(k) for k, *_ in cache.items()]
    return {
        "entries": n,
        "serialized_bytes": file_bytes,
        "memory_bytes": memory,
        "empty_memory_bytes": empty,
        "memory_bytes_per_entry": round((memory - empty) / n, 1) if n else None,
        "mean_ngram_len": round(sum(lengths) / n, 3) if n else None,
        "max_ngram_len": max(lengths, default=0),
    }


class GrowthTracker:
    """``on_verified`` hook: (target tokens processed, cache entries) after every verified round."""

    def __init__(self, cache: NgramCache, tokens0: int = 0) -> None:
        self.cache = cache
        self.tokens = tokens0
        self.points: list[tuple[int, int]] = [(tokens0, len(cache))]

    def __call__(self, tokens: list[int], _logits) -> None:
        self.tokens += len(tokens)
        n = len(self.cache)
        if n != self.points[-1][1]:
            self.points.append((self.tokens, n))

    def finish(self) -> list[tuple[int, int]]:
        if self.points[-1][0] != self.tokens:
            self.points.append((self.tokens, len(self.cache)))
        return self.points


def growth_summary(points: list[tuple[int, int]]) -> dict:
    """Entries per token over the first and the second half of the stream: sub-linear growth shows as
    a smaller second-half rate (paper §2.5)."""
    if len(points) < 2 or points[-1][0] == 0:
        return {"tokens": points[-1][0] if points else 0, "entries": points[-1][1] if points else 0}
    total_t, total_n = points[-1]
    half = total_t / 2
    mid_n = max((n for t, n in points if t <= half), default=0)
    first = mid_n / half if half else 0.0
    second = (total_n - mid_n) / (total_t - half) if total_t > half else 0.0
    return {
        "tokens": total_t,
        "entries": total_n,
        "entries_per_token": round(total_n / total_t, 4),
        "first_half_rate": round(first, 4),
        "second_half_rate": round(second, 4),
    }


def eviction_rows(
    eng: Engine,
    *,
    stream: str,
    prompts: list[str],
    full: int,
    draft_len: int,
    max_new_tokens: int,
    progress: bool = True,
) -> list[dict]:
    """Paper Table 14: the online cache capped at 1/4 and 1/2 of its full size (``full`` entries), LFU
    vs LRU, timed in lockstep with target-only, no cache and the uncapped cache (each fills from empty)."""
    from omnidraft.bench.engine import interleave

    if full < 4:  # a cap of 1/4 would be under one entry: nothing to compare
        return [{"stream": stream, "full_entries": full, "status": f"skipped: the full cache has only {full} entries"}]
    spec = [("none", None, 0), ("full", "lfu", None)]
    spec += [
        (label, policy, max(1, int(full * frac)))
        for frac, label in ((0.25, "1/4"), (0.5, "1/2"))
        for policy in ("lfu", "lru")
    ]
    jobs = [eng.job("target-only", prompts, "target-only", draft_len, max_new_tokens)]
    for label, policy, cap in spec:
        mode = "dm" if label == "none" else "ngram"
        cache = eng.new_cache(cap, policy) if label != "none" else None
        jobs.append(eng.job(f"{label} {policy}", prompts, mode, draft_len, max_new_tokens, cache=cache))
    decs = {j.name: j.decoder for j in jobs}
    runs = interleave(jobs, len(prompts), f"{stream}: cache caps in lockstep", progress)
    base = runs["target-only"].tokens_per_s
    out = []
    for label, policy, cap in spec:
        run = runs[f"{label} {policy}"]
        out.append(
            {
                "stream": stream,
                "size": label,
                "policy": policy if label not in ("none", "full") else None,
                "capacity": cap,
                "full_entries": full,
                "final_entries": len(decs[f"{label} {policy}"].cache) if label != "none" else 0,
                "acceptance_rate": round(run.stats.acceptance_rate, 4),
                "tokens_per_s": round(run.tokens_per_s, 2),
                "speedup": round(run.tokens_per_s / base, 4) if base else None,
                "ngram_hits_per_step": run.row()["ngram_hits_per_step"],
                "status": "ok",
            }
        )
    return out
