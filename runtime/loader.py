"""Open a model path as (backend, tokenizer): a Hugging Face folder or an export folder.

The backend is chosen from what the folder holds (an export's manifest names its format); the loop
never sees the difference. Heavy engines are imported only when their format is asked for, so the
ONNX Runtime path loads no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omnidraft.errors import InvalidArgument, ManifestError, ModelFolderError
from omnidraft.runtime.backends.base import Backend
from omnidraft.runtime.model_checks import check_model_files, config_eos_ids
from omnidraft.runtime.tokenizer import TokenCodec, load_codec
from omnidraft.validate import check_vocab_fits


@dataclass
class LoadedModel:
    backend: Backend
    codec: TokenCodec
    eos_ids: frozenset[int]
    path: Path
    source: str  # "hf" | "onnx" | "executorch"
    info: dict = field(default_factory=dict)


def _eos_from_config(folder: Path) -> set[int]:
    return config_eos_ids(folder)


def check_hf_folder(folder: Path) -> None:
    if not folder.exists():
        raise ModelFolderError(f"model folder {folder} does not exist")
    if not folder.is_dir():
        raise ModelFolderError(f"{folder} is not a folder; pass a Hugging Face model folder or an export folder")
    missing = [n for n in ("config.json", "tokenizer.json") if not (folder / n).is_file()]
    if not any((folder / n).is_file() for n in ("model.safetensors", "model.safetensors.index.json")):
        missing.append("model.safetensors")
    if missing:
        raise ModelFolderError(
            f"model folder {folder} is incomplete: missing {', '.join(missing)} "
            "(a model folder needs config.json, model.safetensors and tokenizer.json)"
        )


def load_model(
    path: str | Path,
    max_seq_len: int | None = None,
    accept_head: str | Path | None = None,
    threads: int | None = None,
    spin: bool = False,
) -> LoadedModel:
    """``accept_head``: an acceptance-head folder to attach to a Hugging Face drafter (one saved in
    the drafter's own folder, head.json + head.safetensors, is attached without asking).
    ``threads``: intra-op threads of an ONNX Runtime session (None: its default, every core); ``spin``:
    let its thread pool spin between runs (runtime/backends/ort.py says when that pays)."""
    folder = Path(path)
    if (folder / "manifest.json").is_file():
        if accept_head is not None:
            raise InvalidArgument(
                f"{folder} is an export folder: its acceptance head is part of the graph; "
                f"re-export the drafter with omnidraft export --accept-head {accept_head}"
            )
        return _load_export(folder, threads, spin)
    if folder.is_dir() and (any(folder.glob("*.pte")) or any(folder.glob("*.onnx"))):
        raise ManifestError(
            f"{folder} holds an exported model but no manifest.json; re-export it with `omnidraft export`"
        )
    check_hf_folder(folder)
    codec = load_codec(folder / "tokenizer.json")
    check_model_files(folder, codec.vocab_size)  # truncated weights, another model's tokenizer: before torch
    from omnidraft.runtime.backends.torch_eager import TorchEagerBackend  # torch only on this path

    backend = TorchEagerBackend(folder, max_seq_len)
    info: dict = {}
    from omnidraft.runtime.draft_length.head_file import HEAD_JSON

    if accept_head is None and (folder / HEAD_JSON).is_file():
        accept_head = folder
    if accept_head is not None:
        from omnidraft.runtime.draft_length.head_file import drafter_identity
        from omnidraft.runtime.draft_length.head_model import load_head

        head, hinfo = load_head(accept_head, drafter_identity(folder), f"the drafter in {folder}")
        backend.attach_head(head)
        info["accept_head"] = str(hinfo.folder)
    eos = _eos_from_config(folder) or set(codec.eos_ids)
    return LoadedModel(backend, codec, frozenset(eos), folder, "hf", info)


def _load_export(folder: Path, threads: int | None = None, spin: bool = False) -> LoadedModel:
    from omnidraft.runtime.manifest import load_manifest

    manifest = load_manifest(folder, verify=False)
    if manifest.device == "qnn-htp":  # a binary for another SoC is named as such before any hash check
        from omnidraft.runtime.backends.qnn import check_binaries

        check_binaries(folder, manifest)
    manifest = load_manifest(folder)
    if manifest.device == "qnn-htp":
        from omnidraft.runtime.backends.qnn import open_qnn

        backend = open_qnn(folder, manifest)
    elif manifest.device_info.get("delegate"):  # a static program lowered to an ExecuTorch delegate
        from omnidraft.runtime.backends.executorch_static import open_static_program

        backend = open_static_program(folder, manifest)
    elif manifest.device != "cpu":
        raise ManifestError(f"{folder / 'manifest.json'} names unknown device {manifest.device!r}; re-export the model")
    elif manifest.format == "onnx":
        from omnidraft.runtime.backends.ort import OrtBackend

        backend = OrtBackend(folder, manifest, threads=threads, spin=spin)
    elif manifest.format == "executorch":
        from omnidraft.runtime.backends.executorch import ExecuTorchBackend

        backend = ExecuTorchBackend(folder, manifest)
    else:
        raise ManifestError(f"{folder / 'manifest.json'} names unknown format {manifest.format!r}; re-export the model")
    codec = load_codec(folder / manifest.tokenizer_file)
    if codec.sha256 != manifest.tokenizer_sha256:
        raise ManifestError(f"the tokenizer in {folder} does not match its manifest; re-export the model")
    check_vocab_fits(
        tokenizer_size=codec.vocab_size, model_width=manifest.vocab_size, tokenizer=str(codec.path), model=str(folder)
    )
    eos = set(getattr(manifest, "eos_token_ids", ()) or ()) or set(codec.eos_ids)
    # None for exports older than the verify-vs-decode measurement (export/parity.py).
    row_stable = (manifest.parity.get("batch_invariance") or {}).get("row_stable")
    return LoadedModel(
        backend,
        codec,
        frozenset(eos),
        folder,
        manifest.format,
        {
            "quant": manifest.quant,
            "row_stable": row_stable,
            "draft_vocab": manifest.draft_vocab.get("size"),
            "device": manifest.device,
        },
    )
