"""`omnidraft export`: HF folder -> quantized, lowered artifact + manifest, gated on parity."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from omnidraft.errors import InvalidArgument
from omnidraft.runtime.manifest import Manifest, sha256_file

from . import publish, recipes
from .hf_model import TOKENIZER_FILE, inspect_folder, weights_sha256

VERSIONED = ("torch", "executorch", "torchao", "transformers", "onnx", "onnxruntime", "omnidraft")


@dataclass
class ExportResult:
    out_dir: Path
    manifest: Manifest
    seconds: float

    def summary(self) -> str:
        m, p = self.manifest, self.manifest.parity
        size = sum((self.out_dir / n).stat().st_size for n in (m.artifact_file, *m.extra_files)) / 2**20
        if "delegate" in m.device_info:
            d = m.device_info
            ids = sorted({i for v in d["delegation"].values() for i in v})
            fig = f"max |Δlogit| {p['max_abs_diff']:.2g} vs eager, running {p['ran']}; .pte delegates: {', '.join(ids)}"
        elif m.device != "cpu":
            v = p["vs_cpu_graph"]
            fig = (
                f"top-1 {v['top1_agreement']:.1%} vs the CPU graph (max |Δ| {v['max_abs_diff']:.2g}) on the "
                f"{p['ran_on']}; compiled for {m.device_info['soc']} (HTP v{m.device_info['htp_arch']})"
            )
        elif p["reference"] == "fp32-eager":
            fig = f"max |Δlogit| {p['max_abs_diff']:.2g} vs eager"
        else:
            fig = f"top-1 {p['top1_agreement']:.1%} vs {p['reference']} (max |Δ| {p['max_abs_diff']:.2g})"
        inv = p.get("batch_invariance")
        if inv:
            fig += f"; verify vs decode max |Δ| {inv['verify_vs_decode_max_abs_diff']:.2g}"
        q = p.get("quality")
        if q:
            fig += f"; held-out text vs fp32: top-1 {q['top1_vs_fp32']:.1%}, perplexity x{q['ppl_ratio']:.3f}" + (
                "" if q["gated"] else " (measured, not gated: the fp32 model does not predict the text)"
            )
        return (
            f"exported {m.format}/{m.quant} {m.architecture} -> {self.out_dir / m.artifact_file} "
            f"({size:.1f} MiB) in {self.seconds:.1f} s; parity {fig}"
        )


def _quiet_libraries() -> None:
    for name in ("torchao", "torch.utils._pytree", "torch.onnx", "onnxruntime"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _versions() -> dict[str, str]:
    out = {}
    for pkg in VERSIONED:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def export_model(
    model_dir: str | Path,
    fmt: str,
    quant: str | None,
    max_seq_len: int,
    out_dir: str | Path,
    *,
    progress: bool = True,
    **options,
) -> ExportResult:
    """``export_recipe`` for a recipe given as arguments (``options``: the other ExportRecipe fields)."""
    recipe = recipes.ExportRecipe(str(model_dir), fmt, quant, max_seq_len, **options)
    return export_recipe(recipe, out_dir, progress=progress)


def export_recipe(recipe: recipes.ExportRecipe, out_dir: str | Path, *, progress: bool = True) -> ExportResult:
    """Export, gate and write. Raises ExportError (nothing is published) if the gate fails.
    ``accept_head``: an acceptance-head folder of this drafter, built into the ONNX graph as the
    extra output ``accept_logits`` (adaptive drafting). ``draft_vocab``: keep only the
    drafter's N most frequent tokens in its output layer (export/draft_vocab.py), ranked by the
    folder's token_counts.json or by ``vocab_corpus``. ``onnx_path``: "genai" (onnxruntime-genai's
    builder), "torch" (torch.onnx) or "auto" (genai where the model fits it). ``device`` "qnn-htp":
    static graphs of ``call_widths`` ("1,8") compiled for the HTP of ``soc`` (export/qnn_export.py).
    ``delegate``: the ExecuTorch backend the program is lowered to (export/et_delegates.py). The
    manifest stores the recipe, its defaults resolved, and the command that rebuilds the folder."""
    r = recipe
    fmt, quant, max_seq_len, embedding_quant, et_path = r.format, r.quant, r.max_seq_len, r.embedding_quant, r.et_path
    onnx_path, device, soc, call_widths, delegate = r.onnx_path, r.device, r.soc, r.call_widths, r.delegate
    accept_head, draft_vocab, vocab_corpus, min_top1 = r.accept_head, r.draft_vocab, r.vocab_corpus, r.min_top1
    t0 = time.perf_counter()
    quant = quant or recipes.default_quant(fmt, device)
    recipes.check_choice(fmt, quant, embedding_quant, et_path, onnx_path, device=device, delegate=delegate)
    info = inspect_folder(r.model)
    npu = None
    if device != "cpu":
        from .qnn_export import check_request

        npu = check_request(info, soc=soc, call_widths=call_widths, max_seq_len=max_seq_len, accept_head=accept_head)
    elif soc is not None or (call_widths is not None and delegate == "xnnpack"):
        raise InvalidArgument(
            "--soc and --call-widths apply to --device qnn-htp (and --call-widths to an ExecuTorch --delegate "
            "other than xnnpack); drop them"
        )
    head_meta: dict = {}
    if accept_head is not None:
        head_meta = _check_head(accept_head, fmt, info)
    vocab = None
    if vocab_corpus is not None and draft_vocab is None:
        raise InvalidArgument("--vocab-corpus ranks tokens for --draft-vocab N; add --draft-vocab or drop it")
    if draft_vocab is not None:
        from .draft_vocab import choose, special_ids

        vocab = choose(
            info.folder,
            int(draft_vocab),
            info.vocab_size,
            special_ids(info.folder, info.bos_token_id, info.eos_token_id),
            Path(vocab_corpus) if vocab_corpus is not None else None,
        )
    if max_seq_len > info.max_position_embeddings:
        raise InvalidArgument(
            f"--max-seq-len {max_seq_len} exceeds the model's max_position_embeddings "
            f"({info.max_position_embeddings}); use at most that"
        )
    from .parity import check_schedule_fits

    check_schedule_fits(max_seq_len)
    lowering = None
    if fmt == "onnx" and npu is None:
        from .onnx_genai import resolve_path

        lowering = resolve_path(onnx_path, info, max_seq_len, trimmed=draft_vocab is not None)
    if fmt == "executorch" and et_path == "llm":  # refuse before minutes of loading and lowering
        from .executorch_llm import unsupported_reason

        if reason := unsupported_reason(info):
            raise InvalidArgument(
                f"the ExecuTorch LLM path does not support this model ({reason}); use --et-path static or auto"
            )
    threshold = recipes.MIN_TOP1_AGREEMENT if min_top1 is None else float(min_top1)
    if not 0.0 <= threshold <= 1.0:
        raise InvalidArgument(f"--min-top1 must be within [0, 1] (got {min_top1})")
    out = Path(out_dir)
    publish.check_out_dir(out, info.folder)
    _quiet_libraries()
    resolved = dataclasses.replace(
        r,
        quant=quant,
        soc=npu["soc"] if npu else soc,
        call_widths=npu["call_widths"] if npu else call_widths,
    )
    command = resolved.command(out_dir)

    from tqdm import tqdm

    stages = ["load model", "export + lower", "parity gate", "write"]
    bar = tqdm(
        total=len(stages),
        desc="export",
        file=sys.stderr,
        disable=not progress,
        bar_format="{desc} [{n}/{total}] {elapsed}",
    )

    def stage(i: int) -> None:
        bar.n = i
        bar.set_description(f"export: {stages[i]}")  # also redraws

    building = publish.staging(out)  # beside --out, swapped in whole: the previous export stays until then
    staging = building.path
    try:
        stage(0)
        from .hf_model import load_model

        model = load_model(info)
        head = None
        if accept_head is not None:
            from omnidraft.runtime.draft_length.head_model import load_head

            head = load_head(accept_head)[0]
        stage(1)
        from . import parity

        sched = parity.parity_tokens(info.folder / TOKENIZER_FILE, info.vocab_size, max_seq_len)
        artifact = staging / recipes.ARTIFACT_FILES[fmt]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # exporter deprecation chatter; real failures raise
            if npu is not None:
                from .qnn_export import build_qnn

                built = build_qnn(
                    model,
                    info,
                    quant=quant,
                    context_len=max_seq_len,
                    widths=npu["widths"],
                    soc=npu["soc"],
                    staging=staging,
                    sched=sched,
                    threshold=threshold,
                    on_gate=lambda: stage(2),
                    vocab=vocab,
                )
            elif fmt == "onnx" and lowering == "genai":
                from .onnx_genai import build_genai

                built = build_genai(
                    model, info, quant, max_seq_len, artifact, sched, threshold, lambda: stage(2), head, vocab
                )
            elif fmt == "onnx":
                from .onnx_export import build_onnx

                built = build_onnx(
                    model, info, quant, max_seq_len, artifact, sched, threshold, lambda: stage(2), head, vocab
                )
            elif delegate != "xnnpack":
                from .et_delegates import build_delegated

                built = build_delegated(
                    model,
                    info,
                    delegate=delegate,
                    quant=quant,
                    context_len=max_seq_len,
                    widths=recipes.parse_call_widths(call_widths),
                    artifact=artifact,
                    sched=sched,
                    on_gate=lambda: stage(2),
                    vocab=vocab,
                )
            else:
                from .executorch_export import build_executorch

                built = build_executorch(
                    model,
                    info,
                    quant,
                    embedding_quant,
                    et_path,
                    max_seq_len,
                    artifact,
                    sched,
                    threshold,
                    lambda: stage(2),
                    vocab,
                )
        stage(3)
        manifest = Manifest(
            format=fmt,
            quant=quant,
            embedding_quant=embedding_quant,
            architecture=info.architecture,
            vocab_size=info.vocab_size,
            max_seq_len=max_seq_len,
            num_layers=info.num_layers,
            num_kv_heads=info.num_kv_heads,
            head_dim=info.head_dim,
            inputs=built.inputs,
            outputs=built.outputs,
            artifact_file=artifact.name,
            artifact_sha256=sha256_file(artifact),
            artifact_bytes=artifact.stat().st_size,
            tokenizer_file=TOKENIZER_FILE,
            tokenizer_sha256=sha256_file(info.folder / TOKENIZER_FILE),
            source_model=str(info.folder.resolve()),
            source_model_sha256=weights_sha256(info),
            exporter_versions=_versions(),
            eos_token_ids=_eos_list(info.eos_token_id),
            bos_token_id=info.bos_token_id,
            parity=built.parity,
            export_command=command,
            recipe=resolved.to_dict(),
            skipped_layers=built.skipped_layers,
            exporter=built.exporter,
            accept_head=head_meta,
            draft_vocab=vocab.manifest_entry() if vocab is not None else {},
            pad_single_row=built.pad_single_row,
            row_splits=built.row_splits,
            device=device if delegate == "xnnpack" else delegate,
            device_info=built.device_info,
            extra_files=built.extra_files,
        )
        publish.publish(building, info.folder, manifest)
        bar.n = len(stages)
        bar.set_description("export: done")
    finally:
        bar.close()
        building.close()
    return ExportResult(out, manifest, time.perf_counter() - t0)


def _check_head(accept_head: str | Path, fmt: str, info) -> dict:
    """Refuse a head for another drafter (or for a format that cannot carry it) before any lowering."""
    import json

    from omnidraft.runtime.draft_length.head_file import HEAD_JSON, check_belongs, drafter_identity, read_head

    if fmt != "onnx":
        raise InvalidArgument(
            "--accept-head needs --format onnx: the ExecuTorch lowerings do not carry an acceptance "
            "head yet (decode a .pte drafter with a fixed --draft-len K)"
        )
    from omnidraft.runtime.draft_length.head_model import load_head

    head = read_head(accept_head)
    check_belongs(head, drafter_identity(info.folder), f"the drafter in {info.folder}")
    meta = json.loads((head.folder / HEAD_JSON).read_text())
    # The per-token biases are added by the runtime once a token is drafted (the graph cannot know a
    # sampled token); the manifest carries them so the torch-free ONNX Runtime path can read them.
    meta["token_bias"] = load_head(head.folder)[0].sparse_token_bias()
    return meta


def _eos_list(eos) -> list[int]:
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]
