"""ExecuTorch delegates beyond XNNPACK for a drafter: CoreML, Vulkan, OpenVINO, Arm Ethos-U.

Accelerator delegates take fixed shapes and do not own a mutable KV cache (lowering transformers'
static-cache wrapper fails in both the CoreML and the Vulkan partitioner), so what they get is the
static graph (export/static_graph.py): one method ``forward_w{w}`` per call width, the KV buffers
passed in and the new rows returned, exactly the NPU form of the QNN path.

Only some of these run here. ExecuTorch's Python runtime registers XNNPACK, OpenVINO and QNN; CoreML
(Apple) and Vulkan (GPU) programs are lowered only, and Ethos-U programs run on an Arm
microcontroller. A lowered-only program cannot be gated on its delegate's output: the gate runs the
exported program that went into the delegate (eager, before lowering) against the model, and reads
the .pte's own delegation table to prove the delegate took the graph. The manifest says which.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from omnidraft.errors import ExportError, InvalidArgument
from omnidraft.runtime.backends.static_kv import StaticKvBackend, io_names

from . import parity
from .draft_vocab import small_logits
from .parity import Built
from .static_graph import StaticStep, sample_inputs, unsupported_reason


@dataclass(frozen=True)
class Delegate:
    backend_id: str  # the id ExecuTorch writes into the .pte's delegate table
    runs_here: bool  # ExecuTorch's Python runtime on this machine can execute it
    where: str  # the hardware it targets
    install: str = ""  # what its partitioner needs beyond the project's packages


DELEGATES = {
    "xnnpack": Delegate("XnnpackBackend", True, "CPU (XNNPACK)"),
    "coreml": Delegate("CoreMLBackend", False, "Apple Neural Engine / GPU / CPU (Core ML)"),
    "vulkan": Delegate("VulkanBackend", False, "GPU (Vulkan)"),
    "openvino": Delegate(
        "OpenvinoBackend", True, "Intel CPU / GPU / NPU (OpenVINO)", "executorch[openvino] (openvino 2025.x)"
    ),
    "ethos-u": Delegate("EthosUBackend", False, "Arm Ethos-U NPU", "executorch[ethos-u] (tosa-tools, ethos-u-vela)"),
}
METHOD = "forward_w{}"
ETHOS_U_TARGET = "ethos-u55-128"


def method_name(width: int) -> str:
    return METHOD.format(width)


def _partitioners(name: str) -> list:
    """The delegate's partitioner, or one line saying what to install (and where) to get it."""
    try:
        if name == "coreml":
            import coremltools as ct
            from executorch.backends.apple.coreml.compiler import CoreMLBackend
            from executorch.backends.apple.coreml.partition import CoreMLPartitioner

            specs = CoreMLBackend.generate_compile_specs(minimum_deployment_target=ct.target.iOS17)
            return [CoreMLPartitioner(compile_specs=specs)]
        if name == "vulkan":
            from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

            return [VulkanPartitioner()]
        if name == "openvino":
            from executorch.backends.openvino.partitioner import OpenvinoPartitioner
            from executorch.exir.backend.compile_spec_schema import CompileSpec

            return [OpenvinoPartitioner([CompileSpec("device", b"CPU")])]
        if name == "ethos-u":
            from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner

            return [EthosUPartitioner(EthosUCompileSpec(ETHOS_U_TARGET))]
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return [XnnpackPartitioner()]
    except ImportError as exc:
        raise InvalidArgument(
            f"the {name} delegate needs {DELEGATES[name].install} ({exc}); it pins versions that conflict with "
            "omnidraft's, so install omnidraft and it in a separate environment"
        ) from None


def delegation_info(pte: Path) -> dict[str, list[str]]:
    """Method -> the delegate ids in the .pte's own tables (what a runtime will look up)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(Path(pte).read_bytes())
    program = getattr(program, "program", program)
    return {plan.name: [d.id for d in plan.delegates] for plan in program.execution_plan}


class _EagerMethod:
    """An exported program's module behind the session interface StaticKvBackend drives."""

    def __init__(self, module, names: list[str]) -> None:
        self.module, self.names = module, names

    def get_inputs(self):
        return [type("Input", (), {"name": n}) for n in self.names]

    @torch.no_grad()
    def run(self, _outputs, feed):
        out = self.module(*(torch.from_numpy(np.ascontiguousarray(feed[n])) for n in self.names))
        return [o.numpy() for o in out]


def build_delegated(
    model,
    info,
    *,
    delegate: str,
    quant: str,
    context_len: int,
    widths: list[int],
    artifact: Path,
    sched,
    on_gate,
    vocab,
) -> Built:
    """The static program lowered to ``delegate``, checked in its delegation table and gated as far as
    this machine can run it."""
    from executorch.exir import to_edge_transform_and_lower

    spec = DELEGATES[delegate]
    if quant != "fp32":
        raise InvalidArgument(
            f"--delegate {delegate} lowers the fp32 program (the delegate picks its own precision); use --quant fp32"
        )
    if reason := unsupported_reason(info):
        raise InvalidArgument(f"the static program cannot take this model ({reason}); use --delegate xnnpack")
    partitioners = _partitioners(delegate)
    if delegate == "ethos-u":
        raise InvalidArgument(
            "Ethos-U runs int8 programs only (TOSA INT profile) and omnidraft has no Arm int8 recipe for a "
            "drafter; lower it with --delegate coreml, vulkan or openvino"
        )
    if vocab is not None:
        from .draft_vocab import trim_head

        trim_head(model, "lm_head", vocab)
    step = StaticStep(model, context_len=context_len).eval()
    programs = {}
    try:
        with warnings.catch_warnings(), torch.no_grad(), small_logits(model):
            warnings.simplefilter("ignore")
            for w in widths:
                sample = sample_inputs(info, context_len=context_len, width=w)
                programs[method_name(w)] = torch.export.export(step, sample, strict=True)
            eager = {w: programs[method_name(w)].module() for w in widths}
            lowered = to_edge_transform_and_lower(programs, partitioner=partitioners).to_executorch()
    except InvalidArgument:
        raise
    except Exception as exc:  # torch.export / partitioners / converters raise many types
        raise ExportError(f"lowering to {delegate} failed: {str(exc).splitlines()[0][:300]}") from exc
    artifact.write_bytes(lowered.buffer)
    table = delegation_info(artifact)
    missing = [m for m in programs if spec.backend_id not in table.get(m, [])]
    if missing:
        raise ExportError(
            f"the {delegate} partitioner took no part of {', '.join(missing)} (the .pte names no "
            f"{spec.backend_id}); this model cannot use that delegate"
        )
    on_gate()
    inputs, outputs = io_names(info.num_layers)
    device_info = {
        "delegate": delegate,
        "backend_id": spec.backend_id,
        "targets": spec.where,
        "runs_here": "yes (ExecuTorch runtime)" if spec.runs_here else "no: lowered only",
        "delegation": table,
        "call_widths": widths,
        "context_len": context_len,
        "methods": {str(w): method_name(w) for w in widths},
    }
    prov = parity.provisional_manifest(
        "executorch", quant, info, context_len, artifact, inputs, outputs, vocab.manifest_entry() if vocab else None
    )
    prov = replace(prov, device=delegate, device_info=device_info)
    if spec.runs_here:
        from omnidraft.runtime.backends.executorch_static import open_static_program

        backend, ran = open_static_program(artifact.parent, prov), f"the .pte on ExecuTorch's {spec.backend_id}"
    else:
        sessions = {w: _EagerMethod(m, inputs) for w, m in eager.items()}
        backend = StaticKvBackend(artifact.parent, prov, sessions, name="static-eager")
        ran = "the exported program handed to the delegate (eager, before lowering); the delegate did not run"
    ref = parity.reference_logits(parity.hf_logits(model), sched)
    fig = parity.gate(parity.run_artifact(backend, sched), ref, ref, "fp32", f"the program lowered to {delegate}", 1)
    fig["ran"] = ran
    exporter = f"static-shape program (torch.export) -> ExecuTorch {delegate} delegate"
    return Built(inputs, outputs, fig, exporter, device_info=device_info)
