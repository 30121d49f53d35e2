"""`omnidraft export`: lower a Hugging Face folder to an ONNX or ExecuTorch artifact + manifest."""

from __future__ import annotations

import argparse

from omnidraft.export.recipes import (
    DEFAULT_CALL_WIDTHS,
    DELEGATES,
    DEVICE_QUANTS,
    DEVICES,
    EMBEDDING_QUANTS,
    ET_PATHS,
    FORMATS,
    MIN_TOP1_AGREEMENT,
    ONNX_PATHS,
    QUANTS,
    SUPPORTED_ARCHITECTURES,
)

HELP = "export a model folder to ONNX or ExecuTorch (.pte) with a KV cache, quantized, parity-checked"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        help="Hugging Face folder (config.json, model.safetensors, tokenizer.json), a .gguf file or a model "
        f"name from `omnidraft models list`; architectures: {', '.join(SUPPORTED_ARCHITECTURES)}",
    )
    # Choices are validated in the library so a bad value gets the same one-line error everywhere.
    parser.add_argument("--format", required=True, help=f"one of: {', '.join(FORMATS)}")
    quants = {**QUANTS, **{f"onnx on {d}": q for d, q in DEVICE_QUANTS.items()}}
    parser.add_argument(
        "--quant",
        default=None,
        help="; ".join(f"{f}: {', '.join(q)}" for f, q in quants.items()) + " (default: the first of each)",
    )
    parser.add_argument(
        "--max-seq-len",
        type=int,
        default=512,
        help="KV cache positions the runtime may use (<= max_position_embeddings; default 512)",
    )
    parser.add_argument("--out", required=True, help="output folder (created; an earlier export there is replaced)")
    parser.add_argument(
        "--embedding-quant",
        default="none",
        help=f"executorch only: {', '.join(EMBEDDING_QUANTS)} (8-bit per-row embedding table)",
    )
    parser.add_argument(
        "--et-path",
        default="auto",
        help=f"executorch lowering: {', '.join(ET_PATHS)} (llm: ExecuTorch's custom sdpa/KV-cache "
        "ops, fastest, Llama/Qwen2 with plain rope; static: transformers static cache; "
        "auto: llm where it fits)",
    )
    parser.add_argument(
        "--onnx-path",
        default="auto",
        help=f"onnx lowering: {', '.join(ONNX_PATHS)} (genai: onnxruntime-genai's model builder, fused "
        "ops, 1.5-3x faster per step; torch: torch.onnx with row-stable attention, any head size; "
        "auto: genai where the model fits it)",
    )
    parser.add_argument(
        "--min-top1",
        type=float,
        default=None,
        help=f"parity bar for quantized artifacts: greedy top-1 agreement with their "
        f"quantized eager reference (default {MIN_TOP1_AGREEMENT})",
    )
    parser.add_argument(
        "--accept-head",
        help="onnx drafters: an acceptance-head folder (head.json + head.safetensors, "
        "from omnidraft adapt --train-head) built into the graph for --draft-len auto",
    )
    parser.add_argument(
        "--draft-vocab",
        type=int,
        help="drafters: keep only the N most frequent tokens in the output "
        "layer (a cheaper drafter call; never for a target), ranked by the model folder's "
        "token_counts.json or --vocab-corpus",
    )
    parser.add_argument("--vocab-corpus", help="with --draft-vocab: a UTF-8 text file to rank the tokens by")
    parser.add_argument(
        "--device",
        default="cpu",
        help=f"onnx: where the artifact runs, one of: {', '.join(DEVICES)} (qnn-htp: static graphs compiled "
        "into QNN context binaries for a Snapdragon Hexagon NPU; needs the npu extra)",
    )
    parser.add_argument("--soc", help="qnn-htp: the Snapdragon SoC to compile for (default SM8650)")
    parser.add_argument(
        "--call-widths",
        help="qnn-htp: tokens per call of each static graph, comma-separated "
        f"(default {','.join(map(str, DEFAULT_CALL_WIDTHS))}: drafting steps, prefill chunks and verification)",
    )
    parser.add_argument(
        "--delegate",
        default="xnnpack",
        help=f"executorch: the backend the program is lowered to, one of: {', '.join(DELEGATES)} "
        "(xnnpack and openvino run here; coreml, vulkan and ethos-u are lowered only)",
    )
    parser.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")


def run(args: argparse.Namespace) -> int:
    from omnidraft.export.pipeline import export_recipe
    from omnidraft.export.recipes import ExportRecipe
    from omnidraft.models.sources import resolve

    recipe = ExportRecipe(
        model=str(resolve(args.model)),
        format=args.format,
        quant=args.quant,
        max_seq_len=args.max_seq_len,
        embedding_quant=args.embedding_quant,
        et_path=args.et_path,
        onnx_path=args.onnx_path,
        device=args.device,
        soc=args.soc,
        call_widths=args.call_widths,
        delegate=args.delegate,
        draft_vocab=args.draft_vocab,
        vocab_corpus=args.vocab_corpus,
        accept_head=args.accept_head,
        min_top1=args.min_top1,
    )
    result = export_recipe(recipe, args.out, progress=not args.no_progress)
    print(result.summary())
    return 0
