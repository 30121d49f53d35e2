"""`omnidraft bench-export`: size, load time and step latency of every format x quant of one model."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from omnidraft.atomic import check_writable, write_text
from omnidraft.errors import InvalidArgument
from omnidraft.export import recipes
from omnidraft.native_output import without_native_lines
from omnidraft.runtime.manifest import is_export_dir, load_manifest

KS = tuple(range(1, 9))


def plan(formats: list[str] | None, quants: list[str] | None) -> list[tuple[str, str]]:
    formats = formats or list(recipes.FORMATS)
    for f in formats:
        if f not in recipes.QUANTS:
            raise InvalidArgument(f"unknown format {f!r}; choose from: {', '.join(recipes.FORMATS)}")
    known = {q for qs in recipes.QUANTS.values() for q in qs}
    for q in quants or []:
        if q not in known:
            raise InvalidArgument(
                f"unknown quant {q!r}; choose from: "
                + "; ".join(f"{f}: {', '.join(qs)}" for f, qs in recipes.QUANTS.items())
            )
    pairs = [(f, q) for f in formats for q in recipes.QUANTS[f] if not quants or q in quants]
    if not pairs:
        raise InvalidArgument(f"no quant in {quants} applies to formats {formats}")
    return pairs


def _backend_class(export_dir: Path):
    """Import the engine (and its kernel libraries) up front: a one-time process cost that is not
    the artifact's load time."""
    manifest = load_manifest(export_dir, verify=False)
    if manifest.format == "onnx":
        from omnidraft.runtime.backends.ort import OrtBackend

        return OrtBackend
    from omnidraft.runtime.backends import executorch as et

    et._load_kernel_libraries(list(manifest.inputs[:2]) == ["tokens", "input_pos"])
    return et.ExecuTorchBackend


def set_threads(threads: int | None, formats) -> None:
    """ExecuTorch's XNNPACK threadpool is process-wide; ORT sessions take theirs per session."""
    if threads and "executorch" in formats:
        from executorch.extension.pybindings import portable_lib

        if hasattr(portable_lib, "_unsafe_reset_threadpool"):
            with without_native_lines():  # a new threadpool probes the CPU, and cpuinfo prints each probe
                portable_lib._unsafe_reset_threadpool(threads)


def open_backend(export_dir: Path, threads: int | None = None):
    cls = _backend_class(export_dir)
    if threads and cls.__name__ == "OrtBackend":
        return cls(export_dir, load_manifest(export_dir), threads=threads)
    return cls(export_dir, load_manifest(export_dir))


def time_steps(backend, context: int, repeats: int, ks=KS) -> tuple[dict[str, float], dict[str, float]]:
    """Median and minimum ms of a k-token forward at position ``context`` (rolled back after each
    call), the way the speculative loop verifies drafts. The minimum is reported too because on a
    shared machine the median also measures the neighbours."""
    ids = [(7 * i + 3) % backend.vocab_size for i in range(context + max(ks))]
    backend.reset()
    backend.forward(ids[:context], 0)
    med, low = {}, {}
    for k in ks:
        samples = []
        for r in range(repeats + 2):  # two warm-up calls
            t = time.perf_counter()
            backend.forward(ids[context : context + k], context)
            dt = time.perf_counter() - t
            backend.rollback(context)
            if r >= 2:
                samples.append(dt * 1e3)
        med[str(k)], low[str(k)] = statistics.median(samples), min(samples)
    return med, low


def run_bench(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    formats=None,
    quants=None,
    max_seq_len: int = 256,
    context: int = 64,
    repeats: int = 100,
    reuse: bool = False,
    et_path: str = "auto",
    threads: int | None = 1,
    draft_vocab: int | None = None,
) -> dict:
    """``draft_vocab``: export a drafter with its output layer cut to its N most frequent tokens, as
    it is deployed (a drafter's step cost is mostly its head)."""
    from omnidraft.export.pipeline import export_model

    pairs = plan(formats, quants)
    if context + max(KS) > max_seq_len:
        raise InvalidArgument(f"--context {context} + 8 verify tokens exceeds --max-seq-len {max_seq_len}")
    if threads is not None and threads < 1:
        raise InvalidArgument(f"--threads must be >= 1 (got {threads}); pass 0 for each library's default")
    out = Path(out_dir)
    check_writable(out, folder=True)  # before the first export, not after it
    rows = []
    for fmt, quant in pairs:
        d = out / (f"{fmt}-{quant}" + (f"-{et_path}" if fmt == "executorch" and et_path != "auto" else ""))
        export_s = None
        if not (reuse and is_export_dir(d)):
            print(f"bench-export: exporting {fmt}/{quant} …", file=sys.stderr)
            t = time.perf_counter()
            export_model(
                model_dir, fmt, quant, max_seq_len, d, progress=False, et_path=et_path, draft_vocab=draft_vocab
            )
            export_s = time.perf_counter() - t
        _backend_class(d)  # import the engine first: a one-time cost, not this artifact's load time
        set_threads(threads, [fmt])
        t = time.perf_counter()
        backend = open_backend(d, threads)  # sha256 check + engine load
        load_ms = (time.perf_counter() - t) * 1e3
        m = backend.manifest
        ms, ms_min = time_steps(backend, context, repeats)
        del backend
        rows.append(
            {
                "format": fmt,
                "quant": quant,
                "exporter": m.exporter,
                "artifact": str(d / m.artifact_file),
                "size_mib": m.artifact_bytes / 2**20,
                "export_s": export_s,
                "load_ms": load_ms,
                "step_ms": ms["1"],
                "verify_ms": ms,
                "verify_ms_min": ms_min,
                "parity_reference": m.parity.get("reference"),
                "parity": m.parity.get("max_abs_diff")
                if m.parity.get("reference") == "fp32-eager"
                else m.parity.get("top1_agreement"),
            }
        )
    result = {
        "model": str(Path(model_dir).resolve()),
        "context": context,
        "repeats": repeats,
        "max_seq_len": max_seq_len,
        "cpus": os.cpu_count(),
        "threads": threads or "library default",
        "draft_vocab": draft_vocab,
        "rows": rows,
    }
    write_text(out / "bench_export.json", json.dumps(result, indent=2) + "\n")
    write_text(out / "bench_export.md", markdown(result))
    return result


def markdown(result: dict) -> str:
    head = (
        "| format | quant | size MiB | load ms | 1-token ms (min) | "
        + " | ".join(f"k={k} ms" for k in KS)
        + " | k=8 min ms | parity |\n|"
        + "---|" * (5 + len(KS) + 2)
        + "\n"
    )
    lines = []
    for r in result["rows"]:
        par = r["parity"]
        par_s = f"{par:.1e} max Δ" if r.get("parity_reference") == "fp32-eager" else f"{par:.1%} top-1"
        path = {"executorch-llm": " (llm)", "transformers": " (static)"}.get(r.get("exporter", "").split(" ")[0], "")
        lines.append(
            f"| {r['format']}{path} | {r['quant']} | {r['size_mib']:.2f} | {r['load_ms']:.0f} | "
            f"{r['step_ms']:.2f} ({r['verify_ms_min']['1']:.2f}) | "
            + " | ".join(f"{r['verify_ms'][str(k)]:.2f}" for k in KS)
            + f" | {r['verify_ms_min']['8']:.2f} | {par_s} |"
        )
    return (
        f"Model: `{result['model']}`; medians (and minima) of {result['repeats']} calls at context {result['context']}, "
        f"cache {result['max_seq_len']}, {result['cpus']} CPUs, intra-op threads: {result['threads']}"
        + (f", head cut to {result['draft_vocab']} tokens" if result.get("draft_vocab") else "")
        + ".\n\n"
        + head
        + "\n".join(lines)
        + "\n"
    )
