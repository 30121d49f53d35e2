"""`omnidraft export`: lower a Hugging Face folder to an ONNX or ExecuTorch artifact + manifest."""

from __future__ import annotations

import argparse

from omnidraft.export.recipes import EMBEDDING_QUANTS, ET_PATHS, FORMATS, MIN_TOP1_AGREEMENT, QUANTS

HELP = "export a model folder to ONNX or ExecuTorch (.pte) with a KV cache, quantized, parity-checked"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="Hugging Face folder (config.json, model.safetensors, "
                        "tokenizer.json); architectures: LlamaForCausalLM, Qwen2ForCausalLM")
    # Choices are validated in the library so a bad value gets the same one-line error everywhere.
    parser.add_argument("--format", required=True, help=f"one of: {', '.join(FORMATS)}")
    parser.add_argument("--quant", default="fp32", help="; ".join(f"{f}: {', '.join(q)}" for f, q in QUANTS.items()))
    parser.add_argument("--max-seq-len", type=int, default=512,
                        help="KV cache positions the runtime may use (<= max_position_embeddings; default 512)")
    parser.add_argument("--out", required=True, help="output folder (created; an earlier export there is replaced)")
    parser.add_argument("--embedding-quant", default="none",
                        help=f"executorch only: {', '.join(EMBEDDING_QUANTS)} (8-bit per-row embedding table)")
    parser.add_argument("--et-path", default="auto",
                        help=f"executorch lowering: {', '.join(ET_PATHS)} (llm: ExecuTorch's custom sdpa/KV-cache "
                             "ops, fastest, Llama/Qwen2 with plain rope; static: transformers static cache; "
                             "auto: llm where it fits)")
    parser.add_argument("--min-top1", type=float, default=None,
                        help=f"parity bar for quantized artifacts: greedy top-1 agreement with their "
                             f"quantized eager reference (default {MIN_TOP1_AGREEMENT})")
    parser.add_argument("--accept-head", help="onnx drafters: an acceptance-head folder (head.json + head.safetensors, "
                        "from omnidraft adapt --train-head) built into the graph for --draft-len auto")
    parser.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")


def run(args: argparse.Namespace) -> int:
    from omnidraft.export.pipeline import export_model

    result = export_model(args.model, args.format, args.quant, args.max_seq_len, args.out,
                          embedding_quant=args.embedding_quant, min_top1=args.min_top1, et_path=args.et_path,
                          progress=not args.no_progress, accept_head=args.accept_head)
    print(result.summary())
    return 0
