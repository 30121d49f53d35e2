"""Weight precision of the onnxruntime-genai graphs: the builder's options per quant, and an 8-bit
embedding table the builder itself cannot write.

The builder quantizes MatMul weights to 4 or 8 bits (MatMulNBits) but its embedding Gather only to
4 bits (GatherBlockQuantized), so an int8 graph keeps its embedding table in fp32: on a real model
that is most of the file (Qwen2.5-0.5B: 545 of 1,058 MiB; Gemma 3 270M, whose table has 262,144
rows: 671 of 992 MiB). ONNX Runtime's GatherBlockQuantized also runs 8-bit blocks, so after the
build the fp32 table is replaced by 8-bit blocks of 32 on the same grid as ``quantize._fq_block``,
which the eager reference models exactly.

A small model takes 4-bit noise badly: Gemma 3 270M kept 68 % of its fp32 greedy choices on
held-out text with every weight at 4 bits. An int4 target therefore climbs ``INT4_LADDER`` one rung
at a time until the quality gate (export/quality.py) passes: first the two ends (the embedding it
reads and the head it writes through) at 8 bits, then also the layers llama.cpp's Q4_K_M keeps wider
(the builder's ``mixed_layers``: the first and last eighth of the layers and every third one between,
their attention and down projections) with asymmetric blocks of 16: the zero points do most of the
work (docs/decisions.md, measurement set 16).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

EMBED_GATHER = "/model/embed_tokens/Gather"


@dataclass(frozen=True)
class Int4Scheme:
    """One rung of the int4 ladder: how the builder quantizes, and what the eager reference mirrors."""

    wide_ends: bool = False  # embedding table and LM head at 8 bits
    mixed_layers: bool = False  # llama.cpp's quantization-sensitive projections at 8 bits
    symmetric: bool = True
    block: int = 32

    def describe(self) -> str:
        if not self.wide_ends:
            return "every weight at 4 bits"
        wide = (
            "the embedding, LM head and llama.cpp's sensitive layers"
            if self.mixed_layers
            else "the embedding and LM head"
        )
        grid = "" if self.symmetric else f", asymmetric blocks of {self.block}"
        return f"{wide} at 8 bits{grid}"

    def to_dict(self) -> dict:
        return {
            "wide_ends": self.wide_ends,
            "mixed_layers": self.mixed_layers,
            "symmetric": self.symmetric,
            "block": self.block,
        }


INT4_LADDER = (
    Int4Scheme(),
    Int4Scheme(wide_ends=True),
    Int4Scheme(wide_ends=True, mixed_layers=True, symmetric=False, block=16),
)
PLAIN = Int4Scheme()


def builder_options(quant: str, scheme: Int4Scheme = PLAIN) -> list[str]:
    """``--extra_options`` for the builder's weight quantization."""
    if quant == "int8":
        return ["block_size=32", "accuracy_level=4"]
    if quant == "int4" and scheme.wide_ends:
        wide = "last_matmul:int8" + (",mixed_layers:int8" if scheme.mixed_layers else "")
        return [
            f"block_size={scheme.block}",
            f"is_symmetric={str(scheme.symmetric).lower()}",
            "op_types_to_quantize=MatMul",
            f"matmul_mixed_precision={wide}",
            "algo_config=rtn",
        ]
    if quant == "int4":
        return ["block_size=32", "op_types_to_quantize=MatMul/Gather"]
    return ["block_size=32"]


_LAYER_MATMUL = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+)/MatMul")
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def layer_bits(model) -> dict[str, int]:
    """Bits of every quantized decoder-layer MatMul of a built graph, keyed by the transformers
    Linear it came from (``model.layers.3.self_attn.q_proj``): what the eager reference must mirror."""
    out = {}
    for n in model.graph.node:
        m = _LAYER_MATMUL.match(n.name)
        if n.op_type != "MatMulNBits" or m is None:
            continue
        bits = next((a.i for a in n.attribute if a.name == "bits"), 4)
        block = "self_attn" if m[2] == "attn" else "mlp"
        for proj in _FUSED.get(m[3], (m[3],)):
            out[f"model.layers.{m[1]}.{block}.{proj}"] = bits
    return out


def quantize_embedding(model) -> bool:
    """Replace an fp32 embedding Gather by an 8-bit GatherBlockQuantized; False when there is none
    (already quantized, or the table is shared with an fp32 LM head)."""
    import numpy as np
    from onnx import helper, numpy_helper

    from .quantize import block_quantize_8bit

    inits = {i.name: i for i in model.graph.initializer}
    node = next((n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits), None)
    if node is None or node.name != EMBED_GATHER:
        return False
    table = node.input[0]
    if any(table in n.input for n in model.graph.node if n is not node):
        return False
    data, scales = block_quantize_8bit(numpy_helper.to_array(inits[table]))
    names = (f"{table}_Q8", f"{table}_scales", f"{table}_zp")
    model.graph.initializer.remove(inits[table])
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(data, names[0]),
            numpy_helper.from_array(scales, names[1]),
            numpy_helper.from_array(np.full(scales.shape, 128, dtype=np.uint8), names[2]),
        ]
    )
    quantized = helper.make_node(
        "GatherBlockQuantized",
        [names[0], node.input[1], names[1], names[2]],
        list(node.output),
        name=node.name,
        domain="com.microsoft",
        bits=8,
        block_size=data.shape[1] // scales.shape[1],
        gather_axis=0,
        quantize_axis=1,
    )
    index = list(model.graph.node).index(node)
    model.graph.node.remove(node)
    model.graph.node.insert(index, quantized)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return True


def precision(model) -> dict[str, int]:
    """Bits of the embedding table and the LM head in a built graph (32: left in fp32)."""
    emb, head = 32, 32
    for n in model.graph.node:
        attrs = {a.name: a.i for a in n.attribute}
        if n.op_type == "GatherBlockQuantized" and "embed" in n.name:
            emb = attrs.get("bits", 4)
        if "lm_head" in n.name and n.op_type == "MatMulNBits":
            head = attrs.get("bits", 4)
    return {"embedding": emb, "lm_head": head}
