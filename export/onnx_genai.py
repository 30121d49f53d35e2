"""ONNX graph from onnxruntime-genai's model builder: the drafter's fast path.

The builder writes the decoder as fused ONNX Runtime ops (GroupQueryAttention with rotary inside,
SkipSimplifiedLayerNormalization, MatMulNBits): a few dozen nodes for a small drafter, where
torch.onnx's trace keeps several times more after ORT's own fusions. A small drafter's step is
mostly kernel launches, so fewer nodes make most of the difference (docs/decisions.md).

Row stability: GroupQueryAttention takes another kernel path for one query row than for several.
A token decoded alone can differ from the same token inside a verify call by enough to flip a
near-tied greedy choice. Fed as two copies of the token (the copy's logits and cache row dropped), a
decode step gives exactly the verify call's row. So an export that may be a target records ``pad_single_row`` and the
runtime pads one-token calls (runtime/backends/ort.py), and the gate holds verify vs decode to the
same bar as the torch.onnx path. A trimmed drafter (--draft-vocab) cannot be a target: it is not
padded, and its verify vs decode is measured only. Even padded, the fused graph's step is faster
than the torch.onnx graph's.

Signature: ``input_ids [1,k]``, ``attention_mask [1,past+k]`` (all ones: positions and the causal
mask come from it), ``past_key_values.{i}.key|value [1,H,past,D]`` in; ``logits [1,k,V]`` (or N
kept columns, export/draft_vocab.py), ``present.{i}.key|value [1,H,past+k,D]`` (and
``accept_logits [1,k]`` with an acceptance head) out. One more input, ``logits_from [1]`` (int64,
default 0), is an overridable initializer: logits are computed for rows ``logits_from..k-1`` only. A
prompt's pass needs no logits at all, and on a large vocabulary the LM head over every prompt row is
most of that pass (Gemma 3's head is 168 M of its 268 M weights), so the runtime asks for the last
row there; every other call leaves it at 0, and the head then reads the same rows as before.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from omnidraft.errors import ExportError
from omnidraft.runtime.manifest import sha256_file

from .genai_weights import INT4_LADDER, PLAIN, Int4Scheme, builder_options, layer_bits, precision, quantize_embedding
from .hf_model import ModelInfo
from .onnx_export import PROTOBUF_LIMIT
from .parity import Built

EXPORTER = "onnxruntime-genai model builder (GroupQueryAttention, MatMulNBits)"
HIDDEN = "hidden_states"
# onnxruntime-genai's own generator runs a target export from this file (the builder's, pointed at
# our artifact): the bench's ort-genai-target-only peer.
GENAI_CONFIG = "genai_config.json"
ACCEPT_OUTPUT = "accept_logits"
LOGITS_FROM = "logits_from"
# Our quants -> the builder's precision (its options: genai_weights.builder_options).
PRECISION = {"fp32": "fp32", "int8": "int8", "int4": "int4"}


def _run_builder(folder: Path, quant: str, out: Path, hidden: bool, scheme: Int4Scheme = PLAIN) -> Path:
    import importlib.util

    if importlib.util.find_spec("onnxruntime_genai") is None:
        raise ExportError(
            "--onnx-path genai needs onnxruntime-genai (pip install onnxruntime-genai==0.18.0, "
            "as pyproject.toml pins it); or use --onnx-path torch"
        )
    precision, opts = PRECISION[quant], builder_options(quant, scheme)
    # windowed_kv_cache=false: sliding-window layers keep full-length past tensors like every other
    # layer (the attention op still masks to the window), so a rollback is the same slice everywhere.
    opts = ["hf_token=false", "windowed_kv_cache=false", *opts]
    opts += ["include_hidden_states=true"] if hidden else []
    cmd = [
        sys.executable,
        "-m",
        "omnidraft.export.genai_builder",
        "-i",
        str(folder),
        "-o",
        str(out),
        "-p",
        precision,
        "-e",
        "cpu",
        "-c",
        str(out / "cache"),
        "--extra_options",
        *opts,
    ]
    # The builder prints per-node progress; only its last line matters when it fails.
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not (out / "model.onnx").is_file():
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"])[-1]
        raise ExportError(f"onnxruntime-genai's model builder failed on {folder} ({last[:300]}); use --onnx-path torch")
    return out / "model.onnx"


def _lm_head(model):
    return next((n for n in model.graph.node if "lm_head" in n.name and n.op_type in ("MatMulNBits", "MatMul")), None)


def _logits_from_input(model) -> None:
    """Slice the LM head's input rows from ``logits_from`` on (module docstring). An input that is
    also an initializer has a default: callers that never feed it, onnxruntime-genai's generator
    among them, get every row."""
    from onnx import TensorProto, helper, numpy_helper

    node = _lm_head(model)
    if node is None:  # no head node to slice: every call computes every row, as the runtime expects then
        return
    consts = {LOGITS_FROM: [0], f"{LOGITS_FROM}/ends": [np.iinfo(np.int64).max], f"{LOGITS_FROM}/axes": [1]}
    for name, value in consts.items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=np.int64), name))
    model.graph.input.append(helper.make_tensor_value_info(LOGITS_FROM, TensorProto.INT64, [1]))
    rows = f"{LOGITS_FROM}/rows"
    at = list(model.graph.node).index(node)
    model.graph.node.insert(
        at, helper.make_node("Slice", [node.input[0], *consts], [rows], name=f"/{LOGITS_FROM}/Slice")
    )
    node.input[0] = rows


def _trim_lm_head(model, vocab) -> None:
    """Keep the kept rows of the LM head: MatMulNBits' B [N, blocks, blob], scales and zero points
    hold one row per output; an fp32 MatMul's weight is [K, N]."""
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    node = _lm_head(model)
    if node is None or node.input[1] not in inits:
        raise ExportError("the builder's graph has no lm_head weight to trim; export without --draft-vocab")
    kept, v = np.asarray(vocab.kept), vocab.vocab_size
    shared = {x for n in model.graph.node if n is not node for x in n.input}
    for i, name in enumerate(node.input):
        if name in inits and name in shared:  # int4 ties the embedding to the head's quantized weight
            copy = model.graph.initializer.add()
            copy.CopyFrom(inits[name])
            copy.name = node.input[i] = f"{name}/lm_head"
            inits[copy.name] = copy

    def put(name: str, array: np.ndarray) -> None:
        inits[name].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array), name))

    if node.op_type == "MatMul":
        put(node.input[1], numpy_helper.to_array(inits[node.input[1]])[:, kept])
    else:
        for name in [x for x in node.input[1:] if x in inits]:
            a = numpy_helper.to_array(inits[name])
            rows = a.reshape(v, -1)[kept]  # 1-D per-block tensors are row-major over [N, blocks]
            put(name, rows.reshape((len(kept),) + a.shape[1:]) if a.ndim > 1 else rows.reshape(-1))
        node.attribute.remove(next(a for a in node.attribute if a.name == "N"))
        node.attribute.append(helper.make_attribute("N", len(kept)))
    for o in model.graph.output:
        if o.name == "logits":
            o.type.tensor_type.shape.dim[-1].dim_value = len(kept)


def _head_graph(head: torch.nn.Module, hidden_size: int, quant: str, ir_version: int, opsets: dict, work: Path):
    """The acceptance head alone (hidden_states -> accept_logits), quantized like the drafter."""
    import onnx

    from .quantize import ort_quantize

    path = work / "head.onnx"
    with torch.no_grad():
        torch.onnx.export(
            head.eval(),
            (torch.zeros(1, 3, hidden_size),),
            str(path),
            input_names=[HIDDEN],
            output_names=[ACCEPT_OUTPUT],
            dynamic_axes={HIDDEN: {1: "k"}, ACCEPT_OUTPUT: {1: "k"}},
            opset_version=opsets[""],
            dynamo=False,
        )
    if quant != "fp32":
        ort_quantize(path, work / "head-q.onnx", quant)
        path = work / "head-q.onnx"
    g = onnx.load(str(path))
    g.ir_version = ir_version
    for imp in g.opset_import:
        imp.version = opsets.get(imp.domain, imp.version)
    return g


def _attach(model, head) -> None:
    """Splice the head's graph onto the decoder's final hidden states (onnx.compose.merge_models runs
    ONNX's checker, which does not know ORT's fused ops); the hidden states stop being an output."""
    prefix = "accept_head/"
    keep = {HIDDEN, ACCEPT_OUTPUT}

    def name(x: str) -> str:
        return x if not x or x in keep else prefix + x

    for init in head.graph.initializer:
        init.name = name(init.name)
        model.graph.initializer.append(init)
    for node in head.graph.node:
        node.name = name(node.name)
        node.input[:] = [name(x) for x in node.input]
        node.output[:] = [name(x) for x in node.output]
        model.graph.node.append(node)
    known = {o.domain for o in model.opset_import}
    model.opset_import.extend(o for o in head.opset_import if o.domain not in known)
    outputs = [o for o in model.graph.output if o.name != HIDDEN] + list(head.graph.output)
    del model.graph.output[:]
    model.graph.output.extend(outputs)


def _write_genai_config(built: Path, artifact: Path) -> None:
    """The builder's genai_config.json beside ``artifact``, naming it as the decoder's graph (the
    graph keeps the builder's input and output names, so its config still describes it)."""
    import json

    from omnidraft.atomic import write_text

    config = json.loads(built.read_text(encoding="utf-8"))
    config["model"]["decoder"]["filename"] = artifact.name
    write_text(artifact.parent / GENAI_CONFIG, json.dumps(config, indent=2) + "\n")


def unsupported_reason(info: ModelInfo, max_seq_len: int, trimmed: bool) -> str | None:
    """Why the builder's graph cannot run this model at this length (None when it can)."""
    if info.head_dim % 16:
        return f"GroupQueryAttention needs a head size that is a multiple of 16, and this model's is {info.head_dim}"
    if not trimmed and max_seq_len >= info.max_position_embeddings:
        # A padded one-token call at the last position writes one row past it.
        return (
            f"a padded decode step needs --max-seq-len below max_position_embeddings ({info.max_position_embeddings})"
        )
    return None


def resolve_path(onnx_path: str, info: ModelInfo, max_seq_len: int, trimmed: bool) -> str:
    """ "auto" -> "genai" where the model fits it, else "torch" (with a note); "genai" must fit."""
    if onnx_path == "torch":
        return onnx_path
    reason = unsupported_reason(info, max_seq_len, trimmed)
    if reason is None:
        return "genai"
    if onnx_path == "genai":
        from omnidraft.errors import InvalidArgument

        raise InvalidArgument(f"--onnx-path genai cannot export this model ({reason}); use --onnx-path torch")
    print(f"note: exporting with torch.onnx: onnxruntime-genai's graph does not fit ({reason})", file=sys.stderr)
    return "torch"


def export_genai(
    folder: Path,
    info: ModelInfo,
    quant: str,
    path: Path,
    vocab=None,
    head: torch.nn.Module | None = None,
    *,
    scheme: Int4Scheme = PLAIN,
) -> tuple[list[str], list[str], dict[str, int], dict[str, int]]:
    """Build, trim, attach the head and write one self-contained ``path``; return (inputs, outputs,
    bits of the embedding table and the LM head (genai_weights.precision), bits of each layer's
    Linears (genai_weights.layer_bits))."""
    import onnx

    with tempfile.TemporaryDirectory(prefix="genai-", dir=path.parent) as tmp:
        work = Path(tmp)
        built = _run_builder(folder, quant, work, head is not None, scheme)
        model = onnx.load(str(built))  # reads its external data
        if quant == "int8" or (quant == "int4" and scheme.wide_ends):
            quantize_embedding(model)
        if vocab is not None:
            _trim_lm_head(model, vocab)
        _logits_from_input(model)
        if head is not None:
            opsets = {o.domain: o.version for o in model.opset_import}
            hidden = next(o for o in model.graph.output if o.name == HIDDEN)
            size = hidden.type.tensor_type.shape.dim[-1].dim_value or head.in_features
            _attach(model, _head_graph(head, size, quant, model.ir_version, opsets, work))
        if model.ByteSize() > PROTOBUF_LIMIT:
            raise ExportError(
                f"the builder's graph holds {model.ByteSize() / 2**30:.1f} GiB, over the 2 GiB a "
                "single-file ONNX artifact can hold; use --format executorch"
            )
        onnx.save(model, str(path))
        if vocab is None and head is None:
            _write_genai_config(work / GENAI_CONFIG, path)
    inputs = [i.name for i in model.graph.input if i.name != LOGITS_FROM]  # the session's required inputs
    outputs = [o.name for o in model.graph.output]
    if inputs[:2] != ["input_ids", "attention_mask"] or outputs[0] != "logits":
        raise ExportError(
            f"the builder's graph has inputs {inputs[:3]}… and outputs {outputs[:2]}…, not the "
            "input_ids/attention_mask -> logits signature omnidraft runs; use --onnx-path torch"
        )
    return inputs, outputs, precision(model), layer_bits(model)


def build_genai(
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
    """Build with onnxruntime-genai and gate against eager PyTorch (fp32 HF, or the same quantized
    reference the torch.onnx path uses); verify vs decode is measured, not gated (see above)."""
    from dataclasses import replace

    from omnidraft.runtime.backends.ort import OrtBackend

    from . import parity, quality
    from .onnx_export import _head_reference
    from .quantize import ort_reference

    if vocab is not None:
        from .draft_vocab import trim_head

        trim_head(model, "lm_head", vocab)
    pad = vocab is None  # it may be a target
    # A target's int4 graph climbs the ladder (genai_weights.INT4_LADDER) until the quality gate passes.
    attempts = INT4_LADDER if quant == "int4" and vocab is None else (PLAIN,)
    for rung, scheme in enumerate(attempts):
        inputs, outputs, bits, layers = export_genai(info.folder, info, quant, artifact, vocab, head, scheme=scheme)
        on_gate()
        prov = parity.provisional_manifest(
            "onnx",
            quant,
            info,
            max_seq_len,
            artifact,
            inputs,
            outputs,
            vocab.manifest_entry() if vocab is not None else None,
        )
        backend = OrtBackend(artifact.parent, replace(prov, pad_single_row=pad))
        qual = quality.measure_artifact(backend, model, info, max_seq_len) if quant != "fp32" and pad else None
        if qual is None or quality.passes(qual) or rung == len(attempts) - 1:
            break
        print(
            f"note: with {scheme.describe()} the graph keeps {qual['top1_vs_fp32']:.1%} of the fp32 model's "
            f"greedy choices (perplexity x{qual['ppl_ratio']:.3f}); rebuilding with {attempts[rung + 1].describe()}",
            file=sys.stderr,
        )
    steps = parity.run_artifact(backend, sched)
    fp32_ref = parity.reference_logits(parity.hf_logits(model), sched)
    if quant == "fp32":
        fig = parity.gate(steps, fp32_ref, fp32_ref, "fp32", "the fp32 onnxruntime-genai graph", threshold)
        ref_model = model
    else:
        ref_model = ort_reference(
            model,
            quant,
            embedding_bits=bits["embedding"] if bits["embedding"] < 32 else 0,
            head_bits=bits["lm_head"] if bits["lm_head"] < 32 else None,
            module_bits=layers,
            grid="rtn" if scheme.wide_ends else "ort",  # the builder's RTN quantizer (genai_weights.builder_options)
            symmetric=scheme.symmetric,
            block=scheme.block,
        )
        ref = parity.reference_logits(parity.hf_logits(ref_model), sched)
        bar = quality.parity_bar(qual, threshold)
        fig = parity.gate(steps, ref, fp32_ref, quant, f"the {quant} onnxruntime-genai graph", bar)
    if head is not None:
        ref_head = head if quant == "fp32" else _head_reference(head, quant)
        fig["accept_head"] = parity.gate_accept(
            backend, sched, ref_model, ref_head, quant == "fp32", f"the {quant} onnxruntime-genai graph"
        )
    what = f"the {quant} onnxruntime-genai graph"
    fig["batch_invariance"] = (
        parity.gate_batch_invariance(
            backend,
            sched,
            max_seq_len,
            f"{what} (decode padded)",
            reopen=lambda splits: OrtBackend(artifact.parent, replace(prov, pad_single_row=pad, row_splits=splits)),
        )
        if pad
        else parity.measure_batch_invariance(backend, sched, max_seq_len)
    )
    fig["batch_invariance"]["single_row_padded"] = pad
    fig["weights_bits"] = bits
    if quant == "int4":
        fig["int4_scheme"] = {**scheme.to_dict(), "layers_at_8_bits": sorted(n for n, b in layers.items() if b == 8)}
    if qual is not None:
        quality.check(qual, what)
        fig["quality"] = qual
    config = artifact.parent / GENAI_CONFIG
    extra = {GENAI_CONFIG: sha256_file(config)} if pad and config.is_file() else {}
    splits = fig["batch_invariance"].get("row_splits", [])
    return Built(inputs, outputs, fig, EXPORTER, pad_single_row=pad, row_splits=splits, extra_files=extra)
