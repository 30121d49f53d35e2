"""Quantization recipes: torchao for ExecuTorch, onnxruntime.quantization for ONNX, and the eager
references the parity gate compares each quantized artifact with."""

from __future__ import annotations

import contextlib
import copy
import io
import logging
from pathlib import Path

import torch

from omnidraft.errors import ExportError

from .recipes import GROUP_SIZE


def untie_lm_head(model: torch.nn.Module) -> None:
    """Give lm_head its own weight: quantizing a tied Linear would also swap the embedding's
    Parameter for a quantized tensor that nn.Embedding cannot index."""
    if not hasattr(model, "get_output_embeddings"):  # ExecuTorch's Transformer never ties
        return
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and getattr(head, "weight", None) is emb.weight:  # a TrimmedHead holds its own rows
        head.weight = torch.nn.Parameter(emb.weight.detach().clone())
        model.config.tie_word_embeddings = False


# --- ExecuTorch (torchao) ------------------------------------------------------------------------


def _config(bits: int):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerAxis, PerGroup

    if bits == 4:
        return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(GROUP_SIZE))
    return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))


HEAD_NAMES = ("lm_head", "output")  # transformers' and ExecuTorch's Transformer's output layer


# Layer groups an 8da4w export may keep at 8 bits where 4 bits fail the quality gate, widest last,
# with the module-name fragments of each in transformers' models and in ExecuTorch's Transformer.
WIDE_GROUPS = {"lm_head": HEAD_NAMES, "mlp": ("mlp", "feed_forward"), "attention": ("self_attn", "attention")}


def torchao_quantize(model: torch.nn.Module, quant: str, *, wide: tuple[str, ...] = ()) -> list[str]:
    """Apply 8da4w / 8da8w in place; return the Linear layers left in fp32. ``wide`` names groups of
    ``WIDE_GROUPS`` that take 8-bit weights under a 4-bit body.

    Only Int8DynamicActivationIntxWeightConfig is used: XNNPACK runs it natively, whereas
    IntxWeightOnlyConfig lowers to garbage logits on XNNPACK (see shared notes). A 4-bit group
    must divide the layer's in_features, so layers that do not fit are skipped and reported.
    """
    from torchao.quantization import quantize_

    if quant not in ("8da4w", "8da8w"):
        raise ValueError(quant)
    bits = 4 if quant == "8da4w" else 8
    untie_lm_head(model)
    skipped = [
        name
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and bits == 4 and m.in_features % GROUP_SIZE
    ]

    def widened(fqn: str) -> bool:
        if fqn in HEAD_NAMES:
            return "lm_head" in wide
        parts = fqn.split(".")
        return any(frag in parts for g in wide if g != "lm_head" for frag in WIDE_GROUPS[g])

    def narrow(m: torch.nn.Module, fqn: str) -> bool:
        return isinstance(m, torch.nn.Linear) and fqn not in skipped and not widened(fqn)

    def wide_linear(m: torch.nn.Module, fqn: str) -> bool:
        return isinstance(m, torch.nn.Linear) and fqn not in skipped and widened(fqn)

    quantize_(model, _config(bits), filter_fn=narrow)
    quantize_(model, _config(8), filter_fn=wide_linear)
    return skipped


def quantize_embedding_int8(model: torch.nn.Module) -> None:
    """8-bit per-row embedding via ExecuTorch's own handler: it emits quantized_decomposed.
    embedding_byte, which the runtime's quantized kernel library executes."""
    from executorch.examples.models.llama.source_transformation.quantize import EmbeddingQuantHandler

    untie_lm_head(model)
    with contextlib.redirect_stdout(io.StringIO()):  # the handler prints one line per table
        EmbeddingQuantHandler(
            model, bitwidth=8, group_size=None, packed=False, quantize_with_hqq=False
        ).quantized_model()


# --- ONNX Runtime ---------------------------------------------------------------------------------


def ort_quantize(src: Path, dst: Path, quant: str) -> None:
    """int8: MatMulNBits 8-bit block 32 on MatMul weights. int4: MatMulNBits block 32 plus the embedding Gather."""
    root = logging.getLogger()
    saved = root.level
    root.setLevel(logging.ERROR)  # the quantizers log advice and per-node INFO lines on the root logger
    try:
        if quant in ("int8", "int4"):
            import onnx
            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

            # Weight-only, blockwise (MatMulNBits): activations stay fp32, so each row of a k-token
            # verify call computes exactly what a 1-token decode computes. quantize_dynamic's per-tensor
            # activation scale couples the rows and broke greedy exactness on the trained pair
            # (tests/test_batch_invariance.py).
            # 8-bit needs accuracy_level 4 (int8 compute, activations quantized per row and block):
            # the fp32-compute 8-bit kernel dequantizes every weight per call, which makes it slower
            # than the fp32 graph. Per-row scales keep the rows of a verify call independent of each
            # other, so a verify row equals the one-token call's row to float rounding.
            int4 = quant == "int4"
            q = MatMulNBitsQuantizer(
                onnx.load(str(src)),
                bits=4 if int4 else 8,
                block_size=GROUP_SIZE,
                is_symmetric=True,
                accuracy_level=None if int4 else 4,
                op_types_to_quantize=("MatMul", "Gather") if int4 else ("MatMul",),
                quant_axes=(("MatMul", 0), ("Gather", 1)),
            )
            q.process()
            q.model.save_model_to_file(str(dst), use_external_data_format=False)
        else:
            raise ValueError(quant)
    except (ValueError, RuntimeError, KeyError) as exc:
        raise ExportError(
            f"onnxruntime {quant} quantization failed ({exc}); try --quant fp32 or another quant"
        ) from exc
    finally:
        root.setLevel(saved)


def _fq_block(
    w: torch.Tensor, bits: int, block: int = GROUP_SIZE, *, grid: str = "ort", symmetric: bool = True
) -> torch.Tensor:
    """Block quantization along dim 1 in blocks of ``block``. ``grid="ort"``: MatMulNBits /
    GatherBlockQuantized's default quantizer, the signed absolute maximum maps to -2^(bits-1).
    ``grid="rtn"``: the RTN quantizer the builder runs with ``algo_config=rtn`` (neural-compressor's
    ``quant_tensor``): symmetric, a step of 2 * max|w| / (2^bits - 1), codes clipped to the signed
    range; asymmetric (``symmetric=False``), a step of (max - min) / (2^bits - 1) and an unsigned
    zero point round(-min / step) clipped to the code range."""
    rows, cols = w.shape
    lo = -(1 << (bits - 1))
    pad = (-cols) % block
    wp = torch.nn.functional.pad(w, (0, pad)).reshape(rows, -1, block)
    if grid == "rtn" and not symmetric:  # float64 as that quantizer computes
        wp, top = wp.double(), (1 << bits) - 1
        mn, mx = wp.amin(-1, keepdim=True), wp.amax(-1, keepdim=True)
        s = torch.where(mx == mn, torch.ones_like(mn), (mx - mn) / top)
        zp = (-mn / s).round().clamp(0, top)
        return (((wp / s + zp).round().clamp(0, top) - zp) * s).reshape(rows, -1)[:, :cols].to(w.dtype)
    if grid == "rtn":  # in float64 as that quantizer computes: the block maximum sits on a rounding tie
        wp = wp.double()
        s = wp.abs().amax(-1, keepdim=True) * 2.0 / ((1 << bits) - 1)
    else:
        s = torch.gather(wp, -1, wp.abs().argmax(-1, keepdim=True)) / lo
    s = torch.where(s == 0, torch.ones_like(s), s)
    return ((wp / s).round().clamp(lo, -lo - 1) * s).reshape(rows, -1)[:, :cols].to(w.dtype)


def ort_reference(
    model: torch.nn.Module,
    quant: str,
    *,
    embedding_bits: int | None = None,
    head_bits: int | None = None,
    module_bits: dict[str, int] | None = None,
    grid: str = "ort",
    symmetric: bool = True,
    block: int = GROUP_SIZE,
) -> torch.nn.Module:
    """An eager copy computing what the ORT-quantized graph computes, up to kernel rounding. Linear
    weights take ``quant``'s bits, or ``module_bits[name]`` where a graph keeps a layer wider; the LM
    head ``head_bits`` (default: the same), the embedding table ``embedding_bits`` (default: 4 for
    int4, as ``ort_quantize`` does, else left in fp32). ``grid``, ``symmetric`` and ``block`` name the
    quantizer of the linear weights (``_fq_block``); the embedding is always on ORT's."""
    bits = 8 if quant == "int8" else 4
    head_bits = head_bits or bits
    module_bits = module_bits or {}
    embedding_bits = embedding_bits if embedding_bits is not None else (4 if quant == "int4" else None)
    ref = copy.deepcopy(model)
    untie_lm_head(ref)
    head = ref.get_output_embeddings()
    with torch.no_grad():
        for name, m in ref.named_modules():
            if isinstance(m, torch.nn.Linear):
                b = head_bits if m is head else module_bits.get(name, bits)
                m.weight.copy_(_fq_block(m.weight, b, block, grid=grid, symmetric=symmetric))
        if embedding_bits:
            emb = ref.get_input_embeddings()
            emb.weight.copy_(_fq_block(emb.weight, embedding_bits))
    return ref.eval()


def block_quantize_8bit(w, block: int = GROUP_SIZE):
    """``_fq_block``'s 8-bit grid as stored codes: uint8 data (code + 128, zero point 128) and fp32
    scales per block of ``block`` along dim 1, for GatherBlockQuantized."""
    import numpy as np

    t = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))
    rows, cols = t.shape
    if cols % block:
        raise ExportError(f"an embedding width of {cols} is not a multiple of the {block}-wide quantization block")
    wp = t.reshape(rows, -1, block)
    mx = torch.gather(wp, -1, wp.abs().argmax(-1, keepdim=True))
    s = mx / -128
    s = torch.where(s == 0, torch.ones_like(s), s)
    q = (wp / s).round().clamp(-128, 127)
    data = (q + 128).to(torch.uint8).reshape(rows, cols).numpy()
    return data, s.reshape(rows, -1).numpy().astype(np.float32)
