"""Publishing an export folder without ever destroying the last good one.

An export is built in a staging folder beside ``--out`` (``.<name>.export-XXXX``, locked while its
exporter lives), completed there (artifact, tokenizer and side files, the manifest last) and then
swapped in for the previous folder in one step (omnidraft.atomic.swap_dir). A kill at any point
leaves the previous export complete, or the new one; the next export removes staging folders whose
exporter is gone. ``--out`` is checked before any work: it may be new, empty, or an earlier export,
never the model folder, a folder holding it, or a folder with other files (the swap replaces the
whole folder).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from omnidraft.atomic import Staging, check_writable, crash_point, recover_dir, remove_stale
from omnidraft.errors import InvalidArgument, OutputError
from omnidraft.runtime.manifest import MANIFEST_FILE, Manifest, write_manifest

from .hf_model import SIDE_FILES, TOKENIZER_FILE
from .recipes import ARTIFACT_FILES

STAGING_TAG = "export"
# What an export folder holds (an ONNX model over 2 GiB keeps its weights in model.onnx.data).
EXPORT_FILES = frozenset({MANIFEST_FILE, TOKENIZER_FILE, *SIDE_FILES, *ARTIFACT_FILES.values(), "model.onnx.data"})


def check_out_dir(out: Path, model_dir: Path) -> None:
    """Refuse an ``--out`` the export could not or must not replace, before any work starts."""
    out, model_dir = Path(out), Path(model_dir)
    where, model = out.resolve(), model_dir.resolve()
    if where == model or where in model.parents:
        raise InvalidArgument(
            f"--out {out} is {'the model folder itself' if where == model else 'a folder holding the model'}; "
            "an export replaces its --out folder whole: pick a new or empty --out folder"
        )
    if out.exists() and not out.is_dir():
        raise InvalidArgument(
            f"cannot write to output folder {out}: it is not a folder; pick a new or empty --out folder"
        )
    if out.is_dir():
        known = EXPORT_FILES | _companions(out / MANIFEST_FILE)
        others = sorted(p.name for p in out.iterdir() if p.name not in known and not p.name.startswith("."))
        if others:
            shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
            raise InvalidArgument(
                f"--out {out} holds files that are not part of an export ({shown}); an export replaces its "
                "--out folder whole: pick a new or empty --out folder"
            )
    try:
        check_writable(out.parent, folder=True)  # the staging folder is built beside --out
    except OutputError as exc:
        raise InvalidArgument(f"cannot write to output folder {out}: {exc}") from None
    recover_dir(out, STAGING_TAG)  # a fallback swap cut short; staging folders of killed exporters
    if out.is_dir():
        remove_stale(out, ".export-*")  # the staging folders of older versions, inside --out


def _companions(manifest: Path) -> frozenset[str]:
    """Plain file names an earlier export's manifest lists beside its artifact (NPU context binaries,
    per-width graphs); none when it is unreadable."""
    import json

    try:
        names = json.loads(manifest.read_text(encoding="utf-8")).get("extra_files") or {}
    except (OSError, ValueError, AttributeError):
        return frozenset()
    return frozenset(n for n in names if isinstance(n, str) and n and Path(n).name == n)


def staging(out: Path) -> Staging:
    return Staging(out, STAGING_TAG)


def publish(stage: Staging, model_dir: Path, manifest: Manifest) -> None:
    """Complete the staged export (tokenizer and side files, the manifest last) and swap it in."""
    for name in (TOKENIZER_FILE, *SIDE_FILES):
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, stage.path / name)
    crash_point("export:copied")
    write_manifest(stage.path, manifest)
    crash_point("export:manifest")
    stage.publish()
