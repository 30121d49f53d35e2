"""`omnidraft export --format onnx --device qnn-htp`: static graphs compiled into QNN context binaries.

Stages: one fp32 static graph per call width (export/static_graph.py), gated against eager PyTorch
on the CPU; for ``a16w8`` a QDQ graph calibrated on the pair's own text (export/qnn_calibrate.py);
each graph compiled by onnxruntime-qnn into an EPContext model plus a context binary for one SoC;
then the compiled graphs run through the runtime's QNN backend (the HTP simulator on x86) and are
compared with the same graphs on ONNX Runtime's CPU provider. The HTP computes in fp16 (or in the
QDQ graph's integers), so the gate is greedy top-1 agreement; verify-vs-decode is measured, not
gated: a drafter's numerics cannot change the output, and the manifest tells a target's caller.
"""

from __future__ import annotations

import math
import platform
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import onnx

from omnidraft.errors import ExportError, InvalidArgument
from omnidraft.runtime.backends import qnn
from omnidraft.runtime.backends.static_kv import StaticKvBackend, io_names
from omnidraft.runtime.manifest import sha256_file

from . import parity
from .onnx_export import PROTOBUF_LIMIT
from .parity import Built
from .static_graph import EXPORTER, export_static

EP_CONTEXT = "EPContext"


def check_request(info, *, soc: str | None, call_widths: str | None, max_seq_len: int, accept_head) -> dict:
    """Refuse, before any model is loaded, what the NPU path cannot take."""
    from .recipes import parse_call_widths
    from .static_graph import unsupported_reason

    qnn.versions()  # onnxruntime-qnn absent: one line naming the extra
    soc = soc or qnn.DEFAULT_SOC
    qnn.check_soc(soc)
    widths = parse_call_widths(call_widths)
    if widths[-1] > max_seq_len:
        raise InvalidArgument(f"call width {widths[-1]} exceeds --max-seq-len {max_seq_len}; use smaller widths")
    if accept_head is not None:
        raise InvalidArgument(
            "--accept-head is not carried by the static NPU graph; export the drafter without it and "
            "decode with a fixed --draft-len K"
        )
    if reason := unsupported_reason(info):
        raise InvalidArgument(f"the static NPU graph cannot take this model ({reason}); export it for the CPU")
    return {"soc": soc, "widths": widths, "call_widths": ",".join(map(str, widths))}


def graph_file(width: int, widths: list[int]) -> str:
    """The narrowest width's graph is the manifest's artifact_file (model.onnx)."""
    return "model.onnx" if width == widths[0] else f"model_w{width}.onnx"


def binary_file(graph: str) -> str:
    return Path(graph).stem + "_qnn.bin"  # the name onnxruntime-qnn gives an EPContext model's binary


def check_fits(model, info) -> None:
    """Refuse a model whose fp32 source graph cannot be one ONNX file (what the compiler reads)."""
    fp32_bytes = 4 * sum(p.numel() for p in model.parameters())
    if info.tie_word_embeddings:
        fp32_bytes += 4 * model.get_input_embeddings().weight.numel()
    if fp32_bytes > 0.95 * PROTOBUF_LIMIT:
        raise InvalidArgument(
            f"{info.architecture} needs ~{fp32_bytes / 2**30:.1f} GiB of fp32 weights, too large for one context "
            "binary here (its source graph is one ONNX file of at most 2 GiB); export it for the CPU"
        )


def check_static(path: Path) -> None:
    """Refuse a graph with a dimension left symbolic: the HTP compiles fixed shapes only."""
    graph = onnx.load(str(path), load_external_data=False).graph
    for v in (*graph.input, *graph.output):
        dims = v.type.tensor_type.shape.dim
        bad = [d.dim_param or "?" for d in dims if not d.HasField("dim_value")]
        if bad:
            raise ExportError(
                f"{path.name} has a dynamic dimension left ({v.name}: {', '.join(bad)}); the NPU takes fixed "
                "shapes only — export it through the static graph (--device qnn-htp)"
            )


def compile_graph(src: Path, dst: Path, *, soc: str, fp16: bool) -> Path:
    """EPContext model ``dst`` + its context binary; refuses a graph the HTP does not take whole."""
    import onnxruntime as ort

    opts = qnn.session_options(soc=soc, fp16=fp16, cpu_fallback=True)
    try:
        ort.ModelCompiler(opts, str(src), flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED).compile_to_file(
            str(dst)
        )
    except Exception as exc:  # ORT's pybind errors
        raise ExportError(
            f"the QNN HTP compiler refused {src.name} for {soc} ({str(exc).splitlines()[0][:240]})"
        ) from None
    graph = onnx.load(str(dst), load_external_data=False).graph
    left = sorted({n.op_type for n in graph.node if n.op_type != EP_CONTEXT and not _boundary_qdq(n, graph)})
    if left:
        raise ExportError(
            f"the HTP cannot take op(s) {', '.join(left)} of {src.name} (they would fall back to the CPU); "
            "this model cannot be an NPU artifact — export it for the CPU"
        )
    binary = dst.with_name(binary_file(dst.name))
    if not binary.is_file():
        raise ExportError(f"the QNN compiler wrote no context binary beside {dst.name}; report the model config")
    return binary


def _boundary_qdq(node, graph) -> bool:
    """A QDQ graph's input Quantize / output Dequantize: the CPU converts I/O, as the QNN EP intends."""
    if node.op_type == "QuantizeLinear":
        return node.input[0] in {i.name for i in graph.input}
    if node.op_type == "DequantizeLinear":
        return node.output[0] in {o.name for o in graph.output}
    return False


def build_qnn(
    model,
    info,
    *,
    quant: str,
    context_len: int,
    widths: list[int],
    soc: str,
    staging: Path,
    sched,
    threshold: float,
    on_gate,
    vocab=None,
) -> Built:
    """Write model.onnx (+ model_w{w}.onnx) and their context binaries into ``staging``; gate them."""
    import onnxruntime as ort

    qnn.check_soc(soc)
    tools = qnn.versions()  # refuses here, before minutes of work, when onnxruntime-qnn is absent
    if vocab is not None:
        from .draft_vocab import trim_head

        trim_head(model, "lm_head", vocab)
    check_fits(model, info)
    work = staging / "fp32"
    work.mkdir()
    names = {w: graph_file(w, widths) for w in widths}
    for w in widths:
        export_static(model, info, context_len=context_len, width=w, path=work / names[w])
        check_static(work / names[w])
    on_gate()
    base = parity.provisional_manifest(
        "onnx", quant, info, context_len, work / names[widths[0]], [], [], vocab.manifest_entry() if vocab else None
    )
    layout = {str(w): {"model": names[w], "binary": binary_file(names[w])} for w in widths}
    prov = replace(base, device=qnn.DEVICE, device_info={"context_len": context_len, "soc": soc, "graphs": layout})

    def cpu_backend(folder: Path) -> StaticKvBackend:
        sessions = {w: ort.InferenceSession(str(folder / names[w]), providers=["CPUExecutionProvider"]) for w in widths}
        return StaticKvBackend(folder, prov, sessions, name="static-cpu")

    fp32_ref = parity.reference_logits(parity.hf_logits(model), sched)
    fp32_fig = parity.gate(
        parity.run_artifact(cpu_backend(work), sched), fp32_ref, fp32_ref, "fp32", "the static graph", 1
    )
    src = work
    if quant != "fp16":
        from .qnn_calibrate import quantize_qdq

        src = staging / "qdq"
        src.mkdir()
        quantize_qdq(prov, info, work, src, names=names, quant=quant)
    cpu_steps = parity.run_artifact(cpu_backend(src), sched)
    files = {}
    for w in widths:
        binary = compile_graph(src / names[w], staging / names[w], soc=soc, fp16=quant == "fp16")
        files[binary.name] = sha256_file(binary)
        if w != widths[0]:
            files[names[w]] = sha256_file(staging / names[w])
    npu = qnn.open_qnn(staging, prov)
    steps = parity.run_artifact(npu, sched)
    vs_cpu = parity.compare(steps, *_rows(cpu_steps, sched))
    if vs_cpu["top1_agreement"] < threshold or not math.isfinite(vs_cpu["max_abs_diff"]):
        raise ExportError(
            f"parity gate failed: the {quant} context binary on the HTP simulator agrees with the CPU graph on "
            f"{vs_cpu['top1_agreement']:.1%} of greedy top-1 tokens (needs {threshold:.0%}); "
            "try --quant fp16, or lower the bar with --min-top1 for a near-untrained model"
        )
    fig = {
        **parity.compare(steps, *fp32_ref),
        "reference": "fp32-eager",
        "threshold_top1": threshold,
        "ran_on": _where_htp_runs(),
        "vs_cpu_graph": {k: vs_cpu[k] for k in ("max_abs_diff", "top1_agreement", "positions")},
        "cpu_graph": "fp32 static graph" if quant == "fp16" else f"{quant} QDQ graph",
        "static_graph_vs_eager_max_abs_diff": fp32_fig["max_abs_diff"],
        "batch_invariance": parity.measure_batch_invariance(npu, sched, context_len),
    }
    if not fig["batch_invariance"]["row_stable"]:
        print(
            f"note: the {quant} HTP graphs are not row-stable (verify vs decode max |Δ| "
            f"{fig['batch_invariance']['verify_vs_decode_max_abs_diff']:.2g}): fine for a drafter, whose numerics "
            "never change the output; as a target, speculative greedy output could differ from target-only",
            file=sys.stderr,
        )
    device_info = {
        **prov.device_info,
        "soc_model": qnn.SOCS[soc][0],
        "htp_arch": qnn.SOCS[soc][1],
        **tools,
        "call_widths": widths,
        "precision": quant,
        "runs_here": "simulator" if _simulated() else "htp",
    }
    shutil.rmtree(work)
    shutil.rmtree(src, ignore_errors=True)  # the intermediate graphs are not part of the artifact
    return Built(
        *io_names(info.num_layers),
        fig,
        f"{EXPORTER} -> onnxruntime-qnn {tools['onnxruntime_qnn']} (QAIRT {tools['qairt']}) context binary",
        device_info=device_info,
        extra_files=files,
    )


def _simulated() -> bool:
    """QAIRT's HTP libraries for x86 hosts run the HTP as a simulator; on a Snapdragon host it is the chip."""
    return platform.machine().lower() in ("x86_64", "amd64", "i686")


def _where_htp_runs() -> str:
    return f"QNN HTP simulator ({platform.machine()})" if _simulated() else f"QNN HTP ({platform.machine()})"


def _rows(steps: dict, sched) -> tuple:
    """The CPU graph's schedule outputs laid out as full-sequence references (rows the steps index)."""
    import numpy as np

    width = steps["prefill"][0].shape[-1]
    a = np.zeros((len(sched.tokens_a), width), dtype=np.float32)
    b = np.zeros((len(sched.tokens_b), width), dtype=np.float32)
    for got, rows, which in steps.values():
        (a if which == "a" else b)[rows] = got
    return a, b
