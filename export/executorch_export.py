"""ExecuTorch `.pte` (XNNPACK) with the KV cache inside the program.

General path for every supported architecture: transformers' ``TorchExportableModuleWithStaticCache``
wraps the model with a StaticCache of ``max_seq_len`` rows registered as mutable buffers. One method
``forward(input_ids[1,k], cache_position[k]) -> logits[1,k,V]`` with k dynamic in [1, max_seq_len]
does prefill, decode and k-token verification; rollback is calling again at an earlier position.
``strict=True`` because the non-strict trace of the cache writes does not lower to XNNPACK.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from transformers import GenerationConfig

from omnidraft.errors import ExportError, InvalidArgument

from .draft_vocab import small_logits
from .hf_model import ModelInfo
from .parity import Built
from .recipes import GROUP_SIZE
from .row_stable_attention import row_stable_attention

INPUTS = ["input_ids", "cache_position"]
OUTPUTS = ["logits"]


def export_pte(model: torch.nn.Module, max_seq_len: int, path: Path) -> None:
    """torch.export -> to_edge_transform_and_lower(XNNPACK) -> .pte written to ``path``."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model.generation_config = GenerationConfig(
        use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": max_seq_len}
    )
    wrapped = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_seq_len)
    k = torch.export.Dim("k", min=1, max=max_seq_len)
    # A sample k of 2: sizes 0 and 1 would be specialised by the tracer.
    sample = {"input_ids": torch.zeros(1, 2, dtype=torch.long), "cache_position": torch.arange(2)}
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.export.export(
                wrapped,
                args=(),
                kwargs=sample,
                strict=True,
                dynamic_shapes={"input_ids": {1: k}, "cache_position": {0: k}},
            )
            lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    except Exception as exc:  # torch.export / exir raise many unrelated types
        raise ExportError(
            f"ExecuTorch lowering failed: {str(exc).splitlines()[0][:300]}; try --quant fp32 or report the model config"
        ) from exc
    with open(path, "wb") as f:
        lowered.write_to_file(f)


def build_executorch(
    model: torch.nn.Module,
    info: ModelInfo,
    quant: str,
    embedding_quant: str,
    et_path: str,
    max_seq_len: int,
    artifact: Path,
    sched,
    threshold: float,
    on_gate,
    vocab=None,
) -> Built:
    """Quantize, lower (LLM path where the model fits it, else the static-cache path) and gate.

    fp32 artifacts are held to fp32 HF eager; quantized ones to the same quantized module run in
    eager mode (XNNPACK's kernels are what is being checked), with the HF fp32 figures recorded.
    """
    import copy
    import sys

    from omnidraft.native_output import without_native_lines
    from omnidraft.runtime.backends.executorch import ExecuTorchBackend

    from . import executorch_llm as llm
    from . import parity, quality
    from .quantize import WIDE_GROUPS, quantize_embedding_int8, torchao_quantize

    reason = llm.unsupported_reason(info)
    if et_path == "llm" and reason:
        raise InvalidArgument(
            f"the ExecuTorch LLM path does not support this model ({reason}); use --et-path static or auto"
        )
    use_llm = et_path == "llm" or (et_path == "auto" and reason is None)
    if et_path == "auto" and reason:
        print(f"note: using the transformers static-cache path: the LLM path lacks {reason}", file=sys.stderr)
    if use_llm:
        qmodel = llm.build_transformer(model, info, max_seq_len)  # from the untrimmed HF weights' names
    if vocab is not None:  # the same trimmed head on both sides, so the references below are trimmed too
        from .draft_vocab import trim_head

        trim_head(model, "lm_head", vocab)
        if use_llm:
            trim_head(qmodel, "output", vocab)
    fp32_ref = parity.reference_logits(parity.hf_logits(model), sched)
    quantized = quant != "fp32" or embedding_quant != "none"
    if use_llm:
        # The weight mapping must reproduce HF eager before anything else is judged.
        conv = parity.compare(
            {"prefill": (llm.eager_logits(qmodel)(sched.tokens_a), slice(None), "a")}, fp32_ref[0], fp32_ref[1]
        )
        parity.check_fp32(conv, "ExecuTorch's Transformer with these weights (eager)")
    else:
        qmodel = copy.deepcopy(model) if quantized else model
    skipped: list[str] = []
    wide: tuple[str, ...] = ()
    if quant != "fp32":
        skipped = torchao_quantize(qmodel, quant)
        if quant == "8da4w" and vocab is None:
            # Judge 4-bit layers in eager mode, before minutes of lowering (XNNPACK's kernels track
            # torchao's eager reference to ~2 % of the logit scale), widening one layer group to 8 bits
            # at a time where they fail: Gemma 3 270M needed more than its head (measured in the manifest).
            eager = (llm.eager_logits if use_llm else parity.hf_logits)(qmodel)
            q = quality.measure_run(eager, model, info, max_seq_len)
            for group in WIDE_GROUPS:
                if quality.passes(q):
                    break
                print(
                    f"note: with {' and '.join(wide) or 'no layer'} at 8 bits the quantized model keeps "
                    f"{q['top1_vs_fp32']:.1%} of the fp32 model's greedy choices (perplexity x{q['ppl_ratio']:.3f}); "
                    f"quantizing the {group} layers to 8 bits too",
                    file=sys.stderr,
                )
                wide += (group,)
                qmodel = llm.build_transformer(model, info, max_seq_len) if use_llm else copy.deepcopy(model)
                skipped = torchao_quantize(qmodel, quant, wide=wide)
                eager = (llm.eager_logits if use_llm else parity.hf_logits)(qmodel)
                q = quality.measure_run(eager, model, info, max_seq_len)
        if skipped:
            print(
                f"note: {len(skipped)} linear layer(s) left in fp32 because their in_features is not a multiple "
                f"of {GROUP_SIZE}: {', '.join(skipped[:6])}{' …' if len(skipped) > 6 else ''}",
                file=sys.stderr,
            )
    if embedding_quant == "int8":
        quantize_embedding_int8(qmodel)
    if use_llm:
        qmodel = llm.use_custom_ops(qmodel)
        with without_native_lines():  # the custom ops' eager kernels start ExecuTorch's threadpool
            ref = parity.reference_logits(llm.eager_logits(qmodel), sched) if quantized else fp32_ref
        with small_logits(qmodel):
            llm.export_pte_llm(qmodel, max_seq_len, artifact)
        inputs, outputs, exporter = llm.INPUTS, llm.OUTPUTS, "executorch-llm (custom sdpa + kv-cache ops, XNNPACK)"
    else:
        ref = parity.reference_logits(parity.hf_logits(qmodel), sched) if quantized else fp32_ref
        with row_stable_attention(qmodel), small_logits(qmodel):
            export_pte(qmodel, max_seq_len, artifact)
        inputs, outputs, exporter = INPUTS, OUTPUTS, "transformers static cache (XNNPACK)"
    on_gate()
    prov = parity.provisional_manifest(
        "executorch",
        quant,
        info,
        max_seq_len,
        artifact,
        inputs,
        outputs,
        vocab.manifest_entry() if vocab is not None else None,
    )
    backend = ExecuTorchBackend(artifact.parent, prov)
    steps = parity.run_artifact(backend, sched)
    what = f"the {quant}{'+int8-embedding' if embedding_quant != 'none' else ''} .pte"
    qual = quality.measure_artifact(backend, model, info, max_seq_len) if quantized and vocab is None else None
    fig = parity.gate(steps, ref, fp32_ref, quant if quantized else "fp32", what, quality.parity_bar(qual, threshold))
    # Measured, not gated. The static path attends through row-stable attention over the whole cache,
    # so its rows are bit-identical (8da4w bundled target: 0.0). The LLM path's custom sdpa is not:
    # on an AVX-512 VNNI CPU its fp32 rows differ by ~1e-5 between a k-token and a 1-token call (still
    # ~2e-6 with the 1-token call fed as two), and 8da4w's per-token activation rounding turns that
    # into jumps of 0.06 now and then. The LLM path stays the default: it is ~3x faster per step.
    fig["batch_invariance"] = parity.measure_batch_invariance(backend, sched, max_seq_len)
    if qual is not None:
        quality.check(qual, what)
        fig["quality"] = qual
        fig["weights_bits"] = {g: 8 if quant == "8da8w" or g in wide else 4 for g in WIDE_GROUPS}
    if not fig["batch_invariance"]["row_stable"]:
        print(
            f"note: {what} is not row-stable (verify vs decode max |Δ| "
            f"{fig['batch_invariance']['verify_vs_decode_max_abs_diff']:.2g}): as a target, its speculative "
            "greedy output can differ from target-only at near-tied tokens; for exact output export the "
            "target with --et-path static (slower), --quant fp32 or --format onnx",
            file=sys.stderr,
        )
    return parity.Built(inputs, outputs, fig, exporter, skipped)
