"""Training checkpoints: a folder per step (safetensors weights, safetensors AdamW state, JSON
step/RNG/loss state), published by an atomic rename plus an atomically written ``latest.json``, so
a half-written checkpoint is never picked up. Tensors are stored on the CPU and restored onto the
device the model lives on, so a run started on one device resumes on another."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from omnidraft.atomic import write_json
from omnidraft.errors import ModelFolderError


def save_checkpoint(ckpt_dir: Path, step: int, model, opt, losses: list, seconds: float = 0.0) -> None:
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=ckpt_dir, prefix=f".step-{step:06d}-"))
    names = {id(p): n for n, p in model.named_parameters()}
    save_file({n: p.detach().cpu().contiguous() for n, p in model.named_parameters()}, str(tmp / "model.safetensors"))
    opt_t = {}
    for p, st in opt.state.items():
        for k, v in st.items():
            v = v.detach().cpu()
            opt_t[f"{names[id(p)]}::{k}"] = v.reshape(-1).contiguous() if k == "step" else v.contiguous()
    save_file(opt_t, str(tmp / "optimizer.safetensors"))
    state = {"step": step, "torch_rng": torch.get_rng_state().tolist(), "losses": losses, "train_seconds": seconds}
    (tmp / "state.json").write_text(json.dumps(state))
    final = ckpt_dir / f"step-{step:06d}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_json(ckpt_dir / "latest.json", {"step": step, "dir": final.name})
    for old in ckpt_dir.glob("step-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(ckpt_dir: Path, model, opt) -> tuple[int, list]:
    """Restores the last published checkpoint; returns (step, losses), or (0, []) if there is none.
    The cumulative training wall time is in ``checkpoint_seconds(ckpt_dir)``."""
    latest = ckpt_dir / "latest.json"
    if not latest.is_file():
        return 0, []
    try:
        folder = ckpt_dir / json.loads(latest.read_text())["dir"]
        model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
        params = dict(model.named_parameters())
        opt_t = load_file(str(folder / "optimizer.safetensors"))
        state = json.loads((folder / "state.json").read_text())
    except (OSError, ValueError, KeyError, SafetensorError) as exc:
        raise ModelFolderError(
            f"checkpoint in {ckpt_dir} is damaged ({exc}); delete that folder and train again"
        ) from exc
    for key, v in opt_t.items():
        name, k = key.split("::")
        p = params[name]
        # AdamW keeps its step count on the CPU whatever the parameters' device
        opt.state[p][k] = v.reshape(()) if k == "step" else v.to(p.device, copy=True)
    torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
    return state["step"], state["losses"]


def checkpoint_seconds(ckpt_dir: Path) -> float:
    """Training wall time accumulated over all runs up to the last checkpoint (0 if none)."""
    try:
        folder = ckpt_dir / json.loads((ckpt_dir / "latest.json").read_text())["dir"]
        return float(json.loads((folder / "state.json").read_text()).get("train_seconds", 0.0))
    except (OSError, ValueError, KeyError):
        return 0.0
