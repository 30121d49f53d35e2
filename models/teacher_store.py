"""The stored form of a teacher pass (models/teacher_shards.py), and loading it for training.

A pass's folder holds ``teacher.json`` (teacher, both tokenizers' digests, the pass's spec, and one
entry per shard with its sha256), ``vocab.safetensors`` (the intersection's drafter ids, which the
records' indices point into) and ``shard-NNNNN.safetensors`` (records in the online adapter's layout,
``adapt.buffer.Record``). Shards are published one by one (atomic rename, manifest rewritten after
each); a shard whose bytes no longer match the manifest is refused with the command that rebuilds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omnidraft.atomic import atomic_path
from omnidraft.errors import DataError
from omnidraft.runtime.manifest import sha256_file

FORMAT = 1
MANIFEST = "teacher.json"
VOCAB_FILE = "vocab.safetensors"


@dataclass
class TeacherSet:
    """One teacher's stored records, ready for ``adapt.loss.make_batch``."""

    name: str
    inter: np.ndarray  # int64: the intersection's drafter ids (the records' dm_idx index into it)
    records: list
    k: int

    @property
    def positions(self) -> int:
        return sum(len(r.dm_rows) + len(r.ng_rows) for r in self.records)


def shards_dir(spec: str | Path) -> Path:
    """A recipe's ``shards`` entry as a folder: ``cache:NAME`` is ``NAME`` under the project cache's
    ``teachers/`` ($OMNIDRAFT_CACHE or ~/.cache/omnidraft), so a committed recipe names passes that
    each machine builds for itself; anything else is a path."""
    text = str(spec)
    if text.startswith("cache:"):
        from omnidraft.models.data import cache_dir

        return cache_dir().parent / "teachers" / text.removeprefix("cache:")
    return Path(text)


def save_shard(records: list, path: Path) -> None:
    from safetensors.numpy import save_file

    def cat(name: str, dtype, width: int | None = None) -> np.ndarray:
        parts = [np.asarray(getattr(r, name)) for r in records]
        if width is not None:
            parts = [a.reshape(-1, width) for a in parts]
        return np.ascontiguousarray(np.concatenate(parts).astype(dtype))

    k = records[0].dm_idx.shape[1]
    arrays = {
        "ids": cat("ids", np.int32),
        "ids_len": np.asarray([len(r.ids) for r in records], dtype=np.int64),
        "dm_rows": cat("dm_rows", np.int32),
        "dm_len": np.asarray([len(r.dm_rows) for r in records], dtype=np.int64),
        "dm_idx": cat("dm_idx", np.int32, k),
        "dm_logp": cat("dm_logp", np.float16, k),
        "dm_tail": cat("dm_tail", np.float32),
        "ng_rows": cat("ng_rows", np.int32),
        "ng_len": np.asarray([len(r.ng_rows) for r in records], dtype=np.int64),
        "ng_split": cat("ng_split", np.uint8),
    }
    with atomic_path(path) as tmp:
        save_file(arrays, str(tmp))


def load_shard(path: Path, k: int) -> list:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    from omnidraft.adapt.buffer import Record

    try:
        a = load_file(str(path))
        split = {n: np.cumsum(a[f"{n}_len"])[:-1] for n in ("ids", "dm", "ng")}
        ids = np.split(a["ids"], split["ids"])
        dm = [np.split(a[f"dm_{f}"], split["dm"]) for f in ("rows", "idx", "logp", "tail")]
        ng = [np.split(a[f"ng_{f}"], split["ng"]) for f in ("rows", "split")]
    except (OSError, KeyError, ValueError, SafetensorError) as exc:
        raise DataError(f"teacher shard {path} cannot be read ({exc})") from None
    return [
        Record(
            prompt="",
            ids=ids[i],
            dm_rows=dm[0][i],
            dm_idx=dm[1][i].reshape(-1, k),
            dm_logp=dm[2][i].reshape(-1, k),
            dm_tail=dm[3][i],
            ng_rows=ng[0][i],
            ng_split=ng[1][i].astype(bool),
        )
        for i in range(len(ids))
    ]


def _rebuild_hint(manifest: dict, folder: Path) -> str:
    return (
        f"delete it and run `python -m omnidraft.models.teacher_shards --teacher {manifest['teacher']} "
        f"--drafter {manifest['drafter']} --out {folder}` with the pass's other options to rebuild it"
    )


def read_manifest(folder: str | Path) -> dict:
    from omnidraft.validate import parse_json

    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise DataError(
            f"{folder} holds no teacher pass ({MANIFEST} missing); run `python -m omnidraft.models.teacher_shards` first"
        )
    fix = f"delete {folder} and run the teacher pass again"
    m = parse_json(path.read_bytes(), error=DataError, where=str(path), fix=fix)
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("shards"), list):
        raise DataError(f"{path} is not a teacher-pass manifest of format {FORMAT}; {fix}")
    return m


def load_teacher_set(folder: str | Path, *, drafter_tokenizer_sha256: str) -> TeacherSet:
    """A finished teacher pass, checked shard by shard against its manifest and against the drafter
    being trained (the records' token ids are that tokenizer's)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    folder = shards_dir(folder)
    m = read_manifest(folder)
    if m["drafter_tokenizer_sha256"] != drafter_tokenizer_sha256:
        raise DataError(
            f"teacher pass {folder} was made for another drafter tokenizer ({m['drafter']}); "
            "run the pass again with --drafter set to the drafter you train"
        )
    if sum(s["records"] for s in m["shards"]) == 0 or len(m["shards"]) * m["spec"]["texts_per_shard"] < m["texts"]:
        raise DataError(f"teacher pass {folder} is unfinished; rerun its command to complete it")
    try:
        inter = load_file(str(folder / VOCAB_FILE))["drafter_ids"].astype(np.int64)
    except (OSError, KeyError, SafetensorError) as exc:
        raise DataError(f"{folder / VOCAB_FILE} cannot be read ({exc}); {_rebuild_hint(m, folder)}") from None
    records = []
    for s in m["shards"]:
        if s["file"] is None:
            continue
        path = folder / s["file"]
        if not path.is_file() or sha256_file(path) != s["sha256"]:
            what = "is missing" if not path.is_file() else "is corrupted (its sha256 differs from the manifest's)"
            raise DataError(f"teacher shard {path} {what}; {_rebuild_hint(m, folder)}")
        records.extend(load_shard(path, m["spec"]["k"]))
    return TeacherSet(name=m["teacher"], inter=inter, records=records, k=m["spec"]["k"])


def load_teacher_passes(folders: str | Path | list, *, drafter_tokenizer_sha256: str) -> TeacherSet:
    """One pass, or several passes of one teacher read as one set, their records in the order listed:
    a pass that answers a stream's further prompts (``--skip-prompts``) extends an earlier one
    without answering its prompts again."""
    if not isinstance(folders, list):
        return load_teacher_set(folders, drafter_tokenizer_sha256=drafter_tokenizer_sha256)
    if not folders or not all(isinstance(f, str) for f in folders):
        raise DataError(f"a teacher set's shards must be a pass folder or a list of them (got {folders!r})")
    sets = [load_teacher_set(f, drafter_tokenizer_sha256=drafter_tokenizer_sha256) for f in folders]
    first = sets[0]
    for f, ts in zip(folders[1:], sets[1:]):
        if ts.name != first.name or ts.k != first.k or not np.array_equal(ts.inter, first.inter):
            raise DataError(
                f"teacher pass {shards_dir(f)} ({ts.name}, top-{ts.k}) cannot extend {shards_dir(folders[0])} "
                f"({first.name}, top-{first.k}): one set joins passes of one teacher with one k and vocabulary map"
            )
    return TeacherSet(name=first.name, inter=first.inter, records=[r for ts in sets for r in ts.records], k=first.k)
