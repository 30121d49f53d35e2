"""GGUF file -> Hugging Face folder (config.json, model.safetensors, tokenizer.json, chat template).

transformers reads GGUF checkpoints itself (``from_pretrained(dir, gguf_file=name)``): the weights
are dequantized to fp32, exactly the values the quantized blocks encode, and the tokenizer is rebuilt
from the vocabulary inside the file. A model loaded that way refuses ``save_pretrained``, so its
state dict is copied into a fresh model built from the same config. The folder is written into a
staging folder and renamed into place, so a failed or interrupted import never leaves half a folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from omnidraft.errors import ModelFolderError
from omnidraft.models.gguf_tokenizers import cache_dir

MAGIC = b"GGUF"
IMPORT_FILE = "gguf_import.json"  # written last: marks a complete conversion


def _fail(path: Path, why: str, fix: str) -> ModelFolderError:
    return ModelFolderError(f"{path}: {why}; {fix}")


def inspect_gguf(path: str | Path) -> dict:
    """Architecture, tensor count and fp32 size of a GGUF file, after checking that it is whole."""
    path = Path(path)
    if not path.is_file():
        raise _fail(path, "no such file", "pass the path of a .gguf model file")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != MAGIC:
        raise _fail(path, "not a GGUF file (it does not start with 'GGUF')", "pass a llama.cpp .gguf model file")
    try:
        import gguf
    except ImportError:
        raise ModelFolderError("reading GGUF files needs the `gguf` package; pip install 'gguf>=0.17'") from None
    try:
        reader = gguf.GGUFReader(path)
        arch = reader.fields["general.architecture"].contents()
        end = max((t.data_offset + int(t.n_bytes) for t in reader.tensors), default=0)
        numel = sum(int(t.n_elements) for t in reader.tensors)
    except Exception as exc:  # a truncated or damaged file: the reader raises assorted errors
        raise _fail(
            path, f"damaged or truncated GGUF ({type(exc).__name__}: {str(exc)[:120]})", "fetch it again"
        ) from None
    size = path.stat().st_size
    if end > size:
        raise _fail(path, f"truncated: its tensors end at byte {end:,} but the file has {size:,}", "fetch it again")
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise _fail(
            path,
            f"architecture {arch!r} is not one transformers' GGUF loader reads",
            f"supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}",
        )
    return {"architecture": arch, "tensors": len(reader.tensors), "fp32_bytes": 4 * numel}


@contextlib.contextmanager
def _quiet():
    """transformers' GGUF loader prints progress bars, per-tensor warnings and version notes that a
    user cannot act on; failures still raise."""
    from transformers.utils import logging as hf_logging

    saved = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    root = logging.getLogger()
    root_level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(saved)
        root.setLevel(root_level)


def _load(path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    try:
        with _quiet():
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError, NotImplementedError) as exc:
        msg = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise _fail(
            path, f"transformers cannot load it ({msg})", "check that it is a complete causal-LM GGUF"
        ) from None
    return tok, model


def _fresh_copy(model):
    """A plain (not GGUF-quantized) model holding the same weights, which save_pretrained accepts."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(model.state_dict(), assign=True)
    fresh.tie_weights()
    return fresh.eval()


def import_gguf(path: str | Path, out: str | Path, *, progress: bool = True) -> Path:
    """Convert ``path`` into the folder ``out`` (created; an existing folder is replaced only once the
    new one is complete)."""
    path, out = Path(path), Path(out)
    meta = inspect_gguf(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out.parent).free
    if free < meta["fp32_bytes"] * 1.05:
        raise ModelFolderError(
            f"converting {path.name} writes about {meta['fp32_bytes'] / 2**30:.1f} GiB of fp32 weights but "
            f"{out.parent} has {free / 2**30:.1f} GiB free; free some space or pass another --out"
        )
    if progress:
        print(f"converting {path.name} ({meta['architecture']}) to a model folder", file=sys.stderr)
    tok, model = _load(path)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=out.parent))
    try:
        fresh = _fresh_copy(model)
        del model
        with _quiet():
            fresh.save_pretrained(staging, safe_serialization=True)
            tok.save_pretrained(staging)
        _write_generation_config(staging, fresh, tok)
        from omnidraft.atomic import write_json

        write_json(staging / IMPORT_FILE, {"gguf": path.name, **meta})
        _share(staging)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(staging, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _share(folder: Path) -> None:
    """mkdtemp makes a private folder; a model folder is read by other users and copied to devices."""
    folder.chmod(0o755)
    for f in folder.iterdir():
        f.chmod(0o644)


def _write_generation_config(folder: Path, model, tok) -> None:
    """Greedy defaults with every end-of-turn id the tokenizer knows (an instruct model ends its
    answer with <|im_end|> or <end_of_turn>, not only with the base EOS)."""
    from omnidraft.atomic import write_json

    eos = set()
    for v in (model.config.eos_token_id, tok.eos_token_id):
        if isinstance(v, int):
            eos.add(v)
        elif isinstance(v, list):
            eos.update(int(x) for x in v)
    for name in ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<eos>"):
        i = tok.convert_tokens_to_ids(name)
        if isinstance(i, int) and i != tok.unk_token_id and name in tok.get_vocab():
            eos.add(i)
    cfg = {"bos_token_id": model.config.bos_token_id, "eos_token_id": sorted(eos), "do_sample": False}
    write_json(folder / "generation_config.json", cfg)


def cached_import(path: str | Path) -> Path:
    """The converted folder of a GGUF file, converting it once (keyed by the file's digest)."""
    path = Path(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    out = cache_dir() / "gguf-import" / h.hexdigest()[:16]
    marker = out / IMPORT_FILE
    if marker.is_file():
        try:
            if json.loads(marker.read_text())["gguf"]:
                return out
        except (OSError, ValueError, KeyError):
            pass
    return import_gguf(path, out)
