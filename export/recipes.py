"""What can be exported, how strictly each artifact is checked, and the export recipe itself. Pure
Python: the CLI reads these tables to validate options and print choices without importing torch."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

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
# ONNX lowering path: "genai" = onnxruntime-genai's model builder (fused ops, the faster graph;
# row-stable with padded one-token calls), "torch" =
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


@dataclass(frozen=True)
class ExportRecipe:
    """What one export builds, as data: the CLI builds it, ``export.pipeline.export_recipe`` consumes
    it, and the manifest stores it (``recipe``) with the command that rebuilds the folder."""

    model: str  # Hugging Face folder of the model
    format: str  # FORMATS
    quant: str | None = None  # QUANTS[format] / DEVICE_QUANTS[device]; None: the first one
    max_seq_len: int = 512  # positions of the KV cache
    embedding_quant: str = "none"  # EMBEDDING_QUANTS (ExecuTorch)
    et_path: str = "auto"  # ExecuTorch lowering path, ET_PATHS
    onnx_path: str = "auto"  # ONNX lowering path, ONNX_PATHS
    device: str = "cpu"  # DEVICES
    soc: str | None = None  # qnn-htp: the SoC compiled for
    call_widths: str | None = None  # static graphs: "1,8"
    delegate: str = "xnnpack"  # ExecuTorch backend, DELEGATES
    draft_vocab: int | None = None  # a drafter's output layer keeps its N most frequent tokens
    vocab_corpus: str | None = None  # with draft_vocab: the text that ranks the tokens
    accept_head: str | None = None  # an acceptance-head folder built into the drafter's graph
    min_top1: float | None = None  # parity gate bar (default MIN_TOP1_AGREEMENT)

    def __post_init__(self) -> None:  # paths as the strings the manifest stores
        for name in ("model", "vocab_corpus", "accept_head"):
            if isinstance(getattr(self, name), Path):
                object.__setattr__(self, name, str(getattr(self, name)))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExportRecipe:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def command(self, out_dir: str | Path) -> str:
        """The ``omnidraft export`` command line that builds this recipe into ``out_dir``."""
        npu = self.device != "cpu"
        args = ["omnidraft", "export", "--model", self.model, "--format", self.format, "--quant", self.quant]
        args += ["--max-seq-len", self.max_seq_len, "--out", out_dir]
        args += ["--embedding-quant", self.embedding_quant] if self.embedding_quant != "none" else []
        args += ["--et-path", self.et_path] if self.format == "executorch" and self.et_path != "auto" else []
        args += ["--onnx-path", self.onnx_path] if self.onnx_path != "auto" else []
        args += ["--accept-head", self.accept_head] if self.accept_head is not None else []
        args += ["--draft-vocab", self.draft_vocab] if self.draft_vocab is not None else []
        args += ["--vocab-corpus", self.vocab_corpus] if self.vocab_corpus is not None else []
        args += ["--device", self.device, "--soc", self.soc, "--call-widths", self.call_widths] if npu else []
        args += ["--delegate", self.delegate] if self.delegate != "xnnpack" else []
        args += ["--call-widths", self.call_widths] if self.call_widths and self.delegate != "xnnpack" else []
        return " ".join(shlex.quote(str(a)) for a in args)


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
