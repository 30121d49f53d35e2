"""ONNX graph with an explicit KV cache: one graph for prefill, 1-token decode and k-token scoring.

Signature: ``input_ids [1,k]`` + ``past_key_values.{i}.key|value [1,H,past,D]`` in,
``logits [1,k,V]`` + ``present.{i}.key|value [1,H,past+k,D]`` out. Positions (rope and the causal
mask) derive from the past length inside the graph, so the runtime feeds nothing else; an empty
past (length 0) is a prefill.

Exporter choice: the TorchScript exporter (``dynamo=False``). With transformers 5.23 and torch 2.13
both exporters produce a correct graph, but the legacy one takes ~1 s where dynamo takes ~15 s on
a tiny model (minutes on a real one), needs no onnxscript rewrite passes, and opset 20 output is
accepted by both ORT quantizers (MatMulNBits then lifts the opset to 21 for int4).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from transformers import DynamicCache

from omnidraft.errors import ExportError
from omnidraft.runtime.draft_length.head_model import forward_with_head

from . import quality
from .draft_vocab import small_logits
from .hf_model import ModelInfo
from .parity import Built
from .row_stable_attention import row_stable_attention

OPSET = 20  # highest the TorchScript exporter emits
EXPORTER = "torch.onnx (TorchScript, opset 20)"
PROTOBUF_LIMIT = 2 * 2**30  # one .onnx file holds at most 2 GiB (protobuf); larger needs external data


ACCEPT_OUTPUT = "accept_logits"  # the acceptance head's output, last (runtime/backends/ort.py)


def io_names(info: ModelInfo, head: bool = False) -> tuple[list[str], list[str]]:
    past = [f"past_key_values.{i}.{t}" for i in range(info.num_layers) for t in ("key", "value")]
    present = [f"present.{i}.{t}" for i in range(info.num_layers) for t in ("key", "value")]
    return ["input_ids", *past], ["logits", *present] + ([ACCEPT_OUTPUT] if head else [])


class _FlatKV(torch.nn.Module):
    """Flat tensors in/out around the HF model's DynamicCache, as ONNX needs; with an acceptance
    head, its logits on the final normed hidden state are one more output."""

    def __init__(self, model: torch.nn.Module, num_layers: int, head: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.model, self.num_layers, self.head = model, num_layers, head

    def forward(self, input_ids: torch.Tensor, *past: torch.Tensor):
        cache = DynamicCache()  # full-length layers: the graph's past may be longer than a sliding window
        for i in range(self.num_layers):
            cache.update(past[2 * i], past[2 * i + 1], i)
        if self.head is None:
            out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
        else:
            out, accept = forward_with_head(
                self.model, self.head, input_ids=input_ids, past_key_values=cache, use_cache=True
            )
        present = []
        for layer in out.past_key_values.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present) if self.head is None else (out.logits, *present, accept)


def export_onnx(
    model: torch.nn.Module, info: ModelInfo, path: Path, head: torch.nn.Module | None = None
) -> tuple[list[str], list[str]]:
    """Write the fp32 graph to ``path``; return (input names, output names)."""
    inputs, outputs = io_names(info, head is not None)
    fp32_bytes = 4 * sum(p.numel() for p in model.parameters())
    if info.tie_word_embeddings:  # the exporter materialises lm_head as its own transposed copy
        fp32_bytes += 4 * model.get_input_embeddings().weight.numel()
    if fp32_bytes > 0.95 * PROTOBUF_LIMIT:
        raise ExportError(
            f"{info.architecture} needs ~{fp32_bytes / 2**30:.1f} GiB of fp32 weights, over the 2 GiB "
            "single-file ONNX limit this exporter writes; use --format executorch"
        )
    # Sample sizes other than 0/1 keep the tracer from specialising on them.
    ids = torch.zeros(1, 3, dtype=torch.long)
    past = [torch.zeros(1, info.num_kv_heads, 2, info.head_dim) for _ in range(2 * info.num_layers)]
    dynamic = {"input_ids": {1: "k"}, "logits": {1: "k"}}
    dynamic.update({n: {2: "past"} for n in inputs[1:]})
    dynamic.update({n: {2: "total"} for n in outputs[1:] if n != ACCEPT_OUTPUT})
    if head is not None:
        dynamic[ACCEPT_OUTPUT] = {1: "k"}
    try:
        # Row-stable attention: a verify row must be bit-identical to its decode step (see the module).
        with warnings.catch_warnings(), torch.no_grad(), row_stable_attention(model), small_logits(model):
            warnings.simplefilter("ignore")  # tracer warnings about shape-to-int casts are expected
            torch.onnx.export(
                _FlatKV(model, info.num_layers, head),
                (ids, *past),
                str(path),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=dynamic,
                opset_version=OPSET,
                dynamo=False,
            )
    except Exception as exc:  # tracer / symbolic errors come in many types
        raise ExportError(f"ONNX export of {info.architecture} failed: {str(exc).splitlines()[0][:300]}") from exc
    return inputs, outputs


def build_onnx(
    model: torch.nn.Module,
    info: ModelInfo,
    quant: str,
    max_seq_len: int,
    artifact: Path,
    sched,
    threshold: float,
    on_gate,
    head: torch.nn.Module | None = None,
    vocab=None,
) -> Built:
    """Export (+ quantize) and gate. The fp32 graph is always gated first: quantization starts from it.
    With an acceptance head, its in-graph output is gated against the eager head on the same schedule.
    ``vocab`` (a DraftVocab) trims the output layer first, so every reference below is trimmed too."""
    from dataclasses import replace

    from omnidraft.runtime.backends.ort import OrtBackend

    from . import parity
    from .quantize import ort_quantize, ort_reference

    if vocab is not None:
        from .draft_vocab import trim_head

        trim_head(model, "lm_head", vocab)

    fp32_path = artifact if quant == "fp32" else artifact.with_name("fp32.onnx")
    inputs, outputs = export_onnx(model, info, fp32_path, head)
    on_gate()
    fp32_ref = parity.reference_logits(parity.hf_logits(model), sched)
    prov = parity.provisional_manifest(
        "onnx",
        quant,
        info,
        max_seq_len,
        fp32_path,
        inputs,
        outputs,
        vocab.manifest_entry() if vocab is not None else None,
    )
    fp32_backend = OrtBackend(fp32_path.parent, prov)
    fp32_steps = parity.run_artifact(fp32_backend, sched)
    fp32_fig = parity.gate(fp32_steps, fp32_ref, fp32_ref, "fp32", "the fp32 ONNX graph", threshold)
    if head is not None:
        fp32_fig["accept_head"] = parity.gate_accept(fp32_backend, sched, model, head, True, "the fp32 ONNX graph")

    def reopen(path: Path):  # a graph that may be a target gets its row splits (parity.find_row_splits)
        if vocab is not None:
            return None
        return lambda splits: OrtBackend(path.parent, replace(prov, artifact_file=path.name, row_splits=splits))

    if quant == "fp32":
        inv = parity.gate_batch_invariance(
            fp32_backend, sched, max_seq_len, "the fp32 ONNX graph", reopen=reopen(fp32_path)
        )
        fp32_fig["batch_invariance"] = inv
        return parity.Built(inputs, outputs, fp32_fig, EXPORTER, row_splits=inv.get("row_splits", []))
    ort_quantize(fp32_path, artifact, quant)
    fp32_path.unlink()
    q_backend = OrtBackend(artifact.parent, replace(prov, artifact_file=artifact.name))
    steps = parity.run_artifact(q_backend, sched)
    qual = quality.measure_artifact(q_backend, model, info, max_seq_len) if vocab is None else None
    ref_model = ort_reference(model, quant)
    ref = parity.reference_logits(parity.hf_logits(ref_model), sched)
    fig = parity.gate(steps, ref, fp32_ref, quant, f"the {quant} ONNX graph", quality.parity_bar(qual, threshold))
    fig["fp32_graph_max_abs_diff"] = fp32_fig["max_abs_diff"]
    fig["batch_invariance"] = parity.gate_batch_invariance(
        q_backend, sched, max_seq_len, f"the {quant} ONNX graph", reopen=reopen(artifact)
    )
    if qual is not None:
        quality.check(qual, f"the {quant} ONNX graph")
        fig["quality"] = qual
    if head is not None:
        fig["accept_head"] = parity.gate_accept(
            q_backend, sched, ref_model, _head_reference(head, quant), False, f"the {quant} ONNX graph"
        )
    return parity.Built(inputs, outputs, fig, EXPORTER, row_splits=fig["batch_invariance"].get("row_splits", []))


def _head_reference(head: torch.nn.Module, quant: str) -> torch.nn.Module:
    """The head's Linears go through MatMulNBits like the drafter's: quantize-dequantize them alike."""
    import copy

    from .quantize import _fq_block

    ref = copy.deepcopy(head)
    with torch.no_grad():
        for m in ref.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.copy_(_fq_block(m.weight, 8 if quant == "int8" else 4))
    return ref.eval()
