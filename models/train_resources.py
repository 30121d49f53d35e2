"""Where a training run runs and whether it fits there: the device (``--device``), and the memory
a recipe needs at a batch scale against what that device has free, checked before any data is built."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from omnidraft.errors import InvalidArgument

DEVICES = ("auto", "cpu", "cuda", "mps")


def resolve_device(name: str | None) -> torch.device:
    """``auto``: the first accelerator torch can use, else the CPU. A named accelerator that this
    machine or this torch build lacks is one clear error, never a silent CPU run."""
    name = name or "auto"
    if name not in DEVICES and not re.fullmatch(r"cuda:\d+", name):
        raise InvalidArgument(f"unknown device {name!r}; choose from: {', '.join(DEVICES)} (or cuda:N)")
    cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        return torch.device("cuda" if cuda else "mps" if mps else "cpu")
    if name.startswith("cuda") and not cuda:
        raise InvalidArgument(
            f"--device {name}: this torch build ({torch.__version__}) sees no CUDA device; "
            "install a CUDA build of torch on a machine with a GPU, or pass --device cpu"
        )
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise InvalidArgument(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here")
    if name == "mps" and not mps:
        raise InvalidArgument("--device mps: this machine or torch build has no MPS device; pass --device cpu")
    return torch.device(name)


def memory_estimate(recipe: dict[str, Any], *, batch_scale: int = 1) -> int:
    """Bytes a training run of ``recipe`` holds at its peak, roughly: fp32 weights, gradients and
    AdamW's two moments of what trains, the teacher's weights, the logits of a batch (several copies
    through softmax, KL and backward) and the layers' saved activations, plus the runtime itself.
    ``batch_scale`` multiplies what one step holds of the batch (corpus rows and teacher records)."""
    from transformers import AutoConfig

    from .train import build_model

    m, tr, d = recipe["model"], recipe["train"], recipe["data"]
    with torch.device("meta"):
        model = build_model(recipe)
    freeze = tuple(tr.get("freeze", ()))
    params = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for n, p in model.named_parameters() if not n.startswith(freeze))
    tokens = tr["batch_size"] * batch_scale * d["seq_len"]
    vocab = tr.get("head_tokens") or m["vocab_size"]
    need = 4 * params + 12 * trained + tokens * vocab * 4 * 6 + tokens * m["hidden_size"] * m["num_hidden_layers"] * 96
    if "teacher" in recipe:
        from omnidraft.models.sources import resolve

        folder = resolve(recipe["teacher"]["model"])
        cfg = AutoConfig.from_pretrained(str(folder))
        need += (folder / "model.safetensors").stat().st_size + tokens * cfg.hidden_size * 4 * 4
    if "teachers" in recipe:
        t = recipe["teachers"]
        records = t.get("records_per_step", 8) * batch_scale
        need += len(t.get("sets", ())) * records * t.get("seq_len", 256) * vocab * 4 * 6
    return need + records_bytes(recipe) + 2**30


def records_bytes(recipe: dict[str, Any]) -> int:
    """The teacher records a run holds in host memory (about twice their stored size), wherever it trains."""
    from .teacher_store import shards_dir

    sets = recipe.get("teachers", {}).get("sets", ())
    folders = [f for s in sets for f in (s["shards"] if isinstance(s["shards"], list) else [s["shards"]])]
    return sum(2 * f.stat().st_size for d in folders for f in shards_dir(d).glob("shard-*.safetensors"))


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def free_memory(device: torch.device) -> int | None:
    """Bytes free where the run's tensors live: the GPU's own memory for CUDA, host memory otherwise
    (MPS shares it)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return _available_memory()


def check_memory(recipe: dict[str, Any], *, device: torch.device | None = None, batch_scale: int = 1) -> None:
    """Refuses, before any data is built, a recipe whose run would not fit the device's free memory."""
    device = device or torch.device("cpu")
    need, free = memory_estimate(recipe, batch_scale=batch_scale), free_memory(device)
    if device.type == "cuda":  # the records stay in host memory; the rest lives on the GPU
        held, host = records_bytes(recipe), _available_memory()
        if host is not None and held > host:
            raise InvalidArgument(
                f"recipe {recipe['name']}'s teacher records need about {held / 2**30:.1f} GiB of host memory and "
                f"{host / 2**30:.1f} GiB is free; train on fewer teachers.sets"
            )
        need -= held
    if free is not None and need > free:
        tr, d = recipe["train"], recipe["data"]
        scale = f", batch scale {batch_scale}" if batch_scale > 1 else ""
        raise InvalidArgument(
            f"recipe {recipe['name']} needs about {need / 2**30:.1f} GiB to train (batch {tr['batch_size']} x "
            f"{d['seq_len']} tokens{scale}) and {device.type} has {free / 2**30:.1f} GiB free; lower "
            "train.batch_size or data.seq_len (or train.head_tokens, teachers.records_per_step, --batch-scale)"
        )
