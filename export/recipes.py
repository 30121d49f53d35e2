"""What can be exported, and how strictly each artifact is checked. Pure Python: the CLI reads
these tables to validate options and print choices without importing torch."""

from __future__ import annotations

from omnidraft.errors import InvalidArgument

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Gemma3ForCausalLM")

# format -> allowed --quant values (first one is the default)
QUANTS: dict[str, tuple[str, ...]] = {
    "onnx": ("fp32", "int8", "int4"),
    "executorch": ("fp32", "8da4w", "8da8w"),
}
FORMATS = tuple(QUANTS)
EMBEDDING_QUANTS = ("none", "int8")
# ExecuTorch lowering path: "llm" = ExecuTorch's LLM path (custom sdpa / KV-cache ops, ~3x faster per
# token), "static" = transformers' static-cache wrapper (any architecture transformers exports),
# "auto" = llm where the model fits it.
ET_PATHS = ("auto", "llm", "static")
# ONNX lowering path: "genai" = onnxruntime-genai's model builder (fused ops: bundled drafter step
# 0.10 vs 0.28 ms, target 1.15 vs 1.79 ms; row-stable with padded one-token calls), "torch" =
# torch.onnx's trace with row-stable attention (any head size), "auto" = genai where the model fits
# it. See export/onnx_genai.py.
ONNX_PATHS = ("auto", "genai", "torch")
ARTIFACT_FILES = {"onnx": "model.onnx", "executorch": "model.pte"}

# Where an ONNX artifact runs (--device). "qnn-htp": static graphs compiled into QNN context binaries
# for a Qualcomm Hexagon NPU (export/qnn_export.py); it computes in fp16 or in a QDQ graph's integers
# (a16w8: 16-bit activations, 8-bit weights, calibrated on the pair's own text).
DEVICES = ("cpu", "qnn-htp")
DEVICE_QUANTS = {"qnn-htp": ("fp16", "a16w8")}
# Call widths of a static graph: 1 for each drafting step; 8 for prefill chunks and for verifying up
# to 7 drafted tokens in one call. Any call runs on the narrowest width that holds it, padded.
DEFAULT_CALL_WIDTHS = (1, 8)
# ExecuTorch delegates (--delegate) the drafter's program can be lowered to (export/et_delegates.py).
DELEGATES = ("xnnpack", "coreml", "vulkan", "openvino", "ethos-u")

# torchao 8da4w groups and ORT MatMulNBits blocks. 32 is the finest group XNNPACK's 4-bit kernel
# and MatMulNBits both take; every hidden size of the supported families is a multiple of it.
GROUP_SIZE = 32

# Parity gate thresholds.
# fp32: the artifact computes the same math as eager PyTorch in another kernel order; measured
# differences on Llama/Qwen2 are ~1e-7..1e-6, so 1e-4 leaves two orders of margin while still
# catching any real lowering bug (wrong mask, stale KV, wrong rope position: all >= 1e-2).
FP32_MAX_ABS_DIFF = 1e-4
# Quantized artifacts are compared with their *own* quantized eager reference (torchao-quantized
# module for ExecuTorch; the fp32 model with weights/activations quantize-dequantized exactly as
# ONNX Runtime's quantizers do, for ONNX). What remains is kernel arithmetic: XNNPACK's 8da4w
# kernel differs from torchao eager by ~2 % of the logit scale, ORT's int8 MatMulInteger by ~1 %.
# Such noise only flips the argmax where the top-2 margin is below it; 0.90 tolerates 10 % such
# near-ties, while a broken graph (e.g. torchao IntxWeightOnlyConfig on XNNPACK, which emits
# garbage) agrees on ~1/vocab of positions. Override with --min-top1 for near-untrained models.
MIN_TOP1_AGREEMENT = 0.90

# Smallest cache that fits the parity schedule (prefill, decode, verify, rollback, verify).
MIN_MAX_SEQ_LEN = 24

# A drafter folder's token frequencies, the ranking `--draft-vocab N` keeps (export/draft_vocab.py).
COUNTS_FILE = "token_counts.json"


def default_quant(fmt: str, device: str = "cpu") -> str:
    return DEVICE_QUANTS[device][0] if device in DEVICE_QUANTS else QUANTS.get(fmt, ("fp32",))[0]


def check_choice(
    fmt: str,
    quant: str,
    embedding_quant: str = "none",
    et_path: str = "auto",
    onnx_path: str = "auto",
    *,
    device: str = "cpu",
    delegate: str = "xnnpack",
) -> None:
    """Refuse an unknown format / quant / embedding quant, listing the valid values."""
    if fmt not in QUANTS:
        raise InvalidArgument(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    _check_target(fmt, device, delegate, onnx_path)
    allowed = DEVICE_QUANTS.get(device, QUANTS[fmt])
    if quant not in allowed:
        where = f"format {fmt}" + (f" on {device}" if device != "cpu" else "")
        raise InvalidArgument(f"unknown quant {quant!r} for {where}; choose one of: {', '.join(allowed)}")
    if embedding_quant not in EMBEDDING_QUANTS:
        raise InvalidArgument(
            f"unknown embedding quant {embedding_quant!r}; choose one of: {', '.join(EMBEDDING_QUANTS)}"
        )
    if et_path not in ET_PATHS:
        raise InvalidArgument(f"unknown ExecuTorch path {et_path!r}; choose one of: {', '.join(ET_PATHS)}")
    if onnx_path not in ONNX_PATHS:
        raise InvalidArgument(f"unknown ONNX path {onnx_path!r}; choose one of: {', '.join(ONNX_PATHS)}")
    if onnx_path != "auto" and fmt != "onnx":
        raise InvalidArgument("--onnx-path applies to --format onnx only; drop it or use --et-path for executorch")
    if embedding_quant != "none" and fmt != "executorch":
        raise InvalidArgument(
            "--embedding-quant applies to --format executorch only (ONNX int4 already quantizes "
            "the embedding Gather); drop the option or switch format"
        )


def _check_target(fmt: str, device: str, delegate: str, onnx_path: str) -> None:
    if device not in DEVICES:
        raise InvalidArgument(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}")
    if delegate not in DELEGATES:
        raise InvalidArgument(f"unknown delegate {delegate!r}; choose one of: {', '.join(DELEGATES)}")
    if device != "cpu" and fmt != "onnx":
        raise InvalidArgument(
            f"--device {device} compiles ONNX graphs; use --format onnx (an ExecuTorch program picks --delegate)"
        )
    if device != "cpu" and onnx_path != "auto":
        raise InvalidArgument(f"--device {device} builds its own static graph; drop --onnx-path")
    if delegate != "xnnpack" and fmt != "executorch":
        raise InvalidArgument("--delegate applies to --format executorch only; drop it or switch format")


def parse_call_widths(text: str | None) -> list[int]:
    """ "1,8" -> [1, 8]; the default when None."""
    if text is None:
        return list(DEFAULT_CALL_WIDTHS)
    try:
        widths = sorted({int(t) for t in str(text).split(",") if t.strip()})
    except ValueError:
        widths = []
    if not widths or widths[0] < 1:
        raise InvalidArgument(f"--call-widths takes positive integers separated by commas, like 1,8 (got {text!r})")
    return widths
