"""Weight precision of the onnxruntime-genai graphs: the builder's options per quant, and an 8-bit
embedding table the builder itself cannot write.

The builder quantizes MatMul weights to 4 or 8 bits (MatMulNBits) but its embedding Gather only to
4 bits (GatherBlockQuantized), so an int8 graph keeps its embedding table in fp32: on a real model
that is most of the file (Qwen2.5-0.5B: 545 of 1,058 MiB; Gemma 3 270M, whose table has 262,144
rows: 671 of 992 MiB). ONNX Runtime's GatherBlockQuantized also runs 8-bit blocks, so after the
build the fp32 table is replaced by 8-bit blocks of 32 on the same grid as ``quantize._fq_block``,
which the eager reference models exactly.

The two ends of a small model (the embedding it reads and the head it writes through) take
quantization noise worst: at 4 bits Gemma 3 270M kept 68 % of its fp32 greedy choices on held-out
text. ``wide_ends`` keeps both at 8 bits under a 4-bit body; the exporter turns it on only where the
all-4-bit graph fails the quality gate (export/quality.py).
"""

from __future__ import annotations

EMBED_GATHER = "/model/embed_tokens/Gather"


def builder_options(quant: str, *, wide_ends: bool = False) -> list[str]:
    """``--extra_options`` for the builder's weight quantization (block 32 is set by the caller)."""
    if quant == "int8":
        return ["accuracy_level=4"]
    if quant == "int4":
        if wide_ends:
            return ["op_types_to_quantize=MatMul", "matmul_mixed_precision=last_matmul:int8", "algo_config=rtn"]
        return ["op_types_to_quantize=MatMul/Gather"]
    return []


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
