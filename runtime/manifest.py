"""The manifest.json written beside every exported artifact, and its validation at load time.

Pure Python (json + hashlib) on purpose: the ONNX Runtime path must load without torch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from omnidraft.atomic import recover_dir, write_text
from omnidraft.errors import ManifestError, ModelFolderError
from omnidraft.validate import Fields, read_json

MANIFEST_FILE = "manifest.json"
SCHEMA_VERSION = 1
FORMATS = ("onnx", "executorch")
MAX_VOCAB = 1 << 24


@dataclass(frozen=True)
class Manifest:
    format: str  # "onnx" | "executorch"
    quant: str  # "fp32" | "int8" | "int4" | "8da4w" | "8da8w"
    architecture: str  # e.g. "LlamaForCausalLM"
    vocab_size: int
    max_seq_len: int  # positions the runtime may hold in its KV cache
    num_layers: int
    num_kv_heads: int
    head_dim: int
    inputs: list[str]
    outputs: list[str]
    artifact_file: str  # file name inside the export folder
    artifact_sha256: str
    artifact_bytes: int
    tokenizer_file: str
    tokenizer_sha256: str
    source_model_sha256: str
    exporter_versions: dict[str, str]
    eos_token_ids: list[int]
    bos_token_id: int | None
    parity: dict[str, Any]
    export_command: str  # how to rebuild this folder (quoted in errors)
    embedding_quant: str = "none"
    exporter: str = ""  # which lowering path produced the artifact
    source_model: str = ""
    skipped_layers: list[str] = field(default_factory=list)
    accept_head: dict[str, Any] = field(default_factory=dict)  # head.json of an in-graph acceptance head
    # A drafter whose output layer keeps only its most frequent tokens (export/draft_vocab.py): size,
    # of, source, coverage and the kept ids. Its rows leave the others at -1e9: it cannot be a target.
    draft_vocab: dict[str, Any] = field(default_factory=dict)
    # The runtime feeds a one-token call as two copies of the token and keeps the first row: with it
    # the graph's rows are the same whatever the call's length (onnxruntime-genai graphs).
    pad_single_row: bool = False
    # Positions where the runtime cuts a call in two, so that no call holds rows on both sides: some
    # kernels round a row differently once the call's total length passes a size (onnxruntime's
    # GEMM in attention with heads wider than 128, export/parity.py find_row_splits). Measured by
    # the export gate; with them every row has the bits a one-token decode gives it.
    row_splits: list[int] = field(default_factory=list)
    # Where the artifact runs: "cpu", or an accelerator ("qnn-htp": QNN context binaries for a
    # Qualcomm HTP). device_info says for which chip, with what, and which files each graph is.
    device: str = "cpu"
    device_info: dict[str, Any] = field(default_factory=dict)
    # Files the artifact needs beside artifact_file (e.g. context binaries): name -> sha256.
    extra_files: dict[str, str] = field(default_factory=dict)
    # The export recipe (export/recipes.py ExportRecipe) with its defaults resolved: what export_command
    # runs, as data.
    recipe: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


_REQUIRED = [f.name for f in fields(Manifest) if f.default is MISSING and f.default_factory is MISSING]


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def is_export_dir(path: str | Path) -> bool:
    """True for a folder produced by `omnidraft export` (it holds manifest.json)."""
    return Path(path).is_dir() and (Path(path) / MANIFEST_FILE).is_file()


def manifest_from_dict(data: dict[str, Any], where: str = MANIFEST_FILE) -> Manifest:
    """Every field type- and range-checked: a forged or damaged manifest gets one line naming the
    field, never a traceback later in a backend."""
    fix = "re-export the model with `omnidraft export`"
    f = Fields(data, where=where, error=ManifestError, fix=fix)
    missing = [k for k in _REQUIRED if not f.has(k)]
    if missing:
        raise ManifestError(f"{where} lacks required keys {missing}; {fix}")
    schema = f.int("schema_version", default=SCHEMA_VERSION)
    if schema != SCHEMA_VERSION:
        raise ManifestError(
            f"{where} has schema version {schema}, this omnidraft reads "
            f"{SCHEMA_VERSION}; re-export the model with this version's `omnidraft export`"
        )
    vocab = f.int("vocab_size", lo=1, hi=MAX_VOCAB)
    m = Manifest(
        format=f.str("format", choices=FORMATS),
        quant=f.str("quant"),
        architecture=f.str("architecture"),
        vocab_size=vocab,
        max_seq_len=f.int("max_seq_len", lo=1, hi=1 << 24),
        num_layers=f.int("num_layers", lo=1, hi=1 << 16),
        num_kv_heads=f.int("num_kv_heads", lo=1, hi=1 << 16),
        head_dim=f.int("head_dim", lo=1, hi=1 << 16),
        inputs=f.str_list("inputs"),
        outputs=f.str_list("outputs"),
        artifact_file=f.filename("artifact_file"),
        artifact_sha256=f.sha256("artifact_sha256"),
        artifact_bytes=f.int("artifact_bytes", lo=1),
        tokenizer_file=f.filename("tokenizer_file"),
        tokenizer_sha256=f.sha256("tokenizer_sha256"),
        source_model_sha256=f.sha256("source_model_sha256"),
        exporter_versions=f.dict("exporter_versions"),
        eos_token_ids=f.int_list("eos_token_ids", lo=0, hi=vocab - 1),
        bos_token_id=f.optional_int("bos_token_id", lo=0, hi=vocab - 1),
        parity=f.dict("parity"),
        export_command=f.str("export_command"),
        embedding_quant=f.str("embedding_quant", default="none"),
        exporter=f.str("exporter", default=""),
        source_model=f.str("source_model", default=""),
        skipped_layers=f.str_list("skipped_layers", default=[]),
        accept_head=f.dict("accept_head", default={}),
        draft_vocab=f.dict("draft_vocab", default={}),
        pad_single_row=f.bool("pad_single_row", default=False),
        row_splits=f.int_list("row_splits", default=[], lo=1),
        device=f.str("device", default="cpu"),
        device_info=f.dict("device_info", default={}),
        extra_files=f.dict("extra_files", default={}),
        recipe=f.dict("recipe", default={}),
        schema_version=schema,
    )
    for name, digest in m.extra_files.items():
        if not isinstance(digest, str):
            raise f.fail(f"extra_files.{name}", "a sha256 string", digest)
    for k, v in m.exporter_versions.items():
        if not isinstance(v, str):
            raise f.fail(f"exporter_versions.{k}", "a version string", v)
    if m.draft_vocab:
        dv = f.sub("draft_vocab")
        size = dv.int("size", lo=1, hi=vocab)
        if len(dv.int_list("kept", lo=0, hi=vocab - 1)) != size:
            raise dv.fail("kept", f"a list of {size} token ids (draft_vocab.size)")
    if m.row_splits and (m.row_splits != sorted(set(m.row_splits)) or m.row_splits[-1] >= m.max_seq_len):
        raise f.fail("row_splits", f"increasing positions below max_seq_len ({m.max_seq_len})", m.row_splits)
    if m.parity.get("batch_invariance") is not None:  # older exports have none
        inv = f.sub("parity").sub("batch_invariance")
        row_stable = inv.obj.get("row_stable")
        if row_stable is not None and not isinstance(row_stable, bool):
            raise inv.fail("row_stable", "true, false or null", row_stable)
        if inv.has("row_splits") and inv.int_list("row_splits") != m.row_splits:
            raise f.fail(
                "row_splits",
                "the splits its row stability was measured with (parity.batch_invariance.row_splits)",
                m.row_splits,
            )
        if inv.has("single_row_padded") and inv.bool("single_row_padded") != m.pad_single_row:
            raise f.fail(
                "pad_single_row",
                "what its row stability was measured with (parity.batch_invariance.single_row_padded)",
                m.pad_single_row,
            )
    return m


def load_manifest(export_dir: str | Path, verify: bool = True) -> Manifest:
    """Read and check an export folder's manifest.

    With ``verify`` (the default) the artifact and tokenizer files must exist and match their
    sha256, so a truncated or swapped file is refused before any runtime tries to parse it.
    """
    export_dir = Path(export_dir)
    path = export_dir / MANIFEST_FILE
    if not export_dir.exists():
        recover_dir(export_dir)  # a swap cut short on a filesystem without atomic exchange
    if not export_dir.is_dir():
        raise ModelFolderError(f"export folder {export_dir} does not exist; create it with `omnidraft export`")
    if not path.is_file():
        raise ManifestError(
            f"{export_dir} has no {MANIFEST_FILE}; it is not an export folder — "
            "create one with `omnidraft export --model HF_FOLDER --format ... --out DIR`"
        )
    data = read_json(path, error=ManifestError, what="manifest", fix="re-export the model with `omnidraft export`")
    m = manifest_from_dict(data, str(path))
    if verify:
        _check_file(export_dir, m.artifact_file, m.artifact_sha256, "artifact", m)
        _check_file(export_dir, m.tokenizer_file, m.tokenizer_sha256, "tokenizer", m)
        for name, digest in m.extra_files.items():
            _check_file(export_dir, name, digest, "companion", m)
    return m


def _check_file(export_dir: Path, name: str, expected: str, what: str, m: Manifest) -> None:
    p = export_dir / name
    if Path(name).name != name:
        raise ManifestError(
            f"{export_dir / MANIFEST_FILE} names {what} {name!r} outside the folder; "
            f"re-export with `{m.export_command}`"
        )
    if not p.is_file():
        raise ManifestError(f"{what} file {p} listed in the manifest is missing; re-export with `{m.export_command}`")
    got = sha256_file(p)
    if got != expected:
        raise ManifestError(
            f"{what} file {p} does not match its manifest (sha256 {got[:12]}… != "
            f"{expected[:12]}…): it was truncated, corrupted or replaced; "
            f"re-export with `{m.export_command}`"
        )


def write_manifest(export_dir: str | Path, manifest: Manifest) -> Path:
    """Write manifest.json atomically (temp file in the same folder + os.replace)."""
    return write_text(Path(export_dir) / MANIFEST_FILE, manifest.to_json())
