"""Reproducible training recipes for the bundled drafter/target pair.

    python -m omnidraft.models.train --recipe drafter [--resume]
    python -m omnidraft.models.train --recipe target  [--resume]
    python -m omnidraft.models.train --recipe drafter-teachers --device cuda --batch-scale 8
    python -m omnidraft.models.train --install-tokenizers

A recipe (``models/recipes/<name>.json``) fixes the architecture, tokenizer, data mix, seeds and
optimizer schedule. Training data is a pure function of the recipe (seeded chunk shuffle, packing
into fixed-length rows), so a run that is interrupted resumes from its last checkpoint and finishes
with the same weights as an uninterrupted run (models/checkpoints.py). On an accelerator the same
recipe runs with a batch several steps wide (``--batch-scale``): the same data in the same order,
fewer updates. A recipe may also
start from a real model's layers and learn from a teacher's distributions (models/distill.py), in
its own vocabulary or, through stored teacher passes (models/teacher_shards.py), in a target's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnidraft.atomic import atomic_path, save_figure, write_json
from omnidraft.errors import DataError, InvalidArgument, ModelFolderError

from .checkpoints import checkpoint_seconds, load_checkpoint, save_checkpoint
from .distill import CrossVocabTeachers, head_tokens, load_teacher, step_loss
from .train_resources import check_memory, resolve_device

MODELS_DIR = Path(__file__).resolve().parent
RECIPES_DIR = MODELS_DIR / "recipes"
BUNDLED_DIR = MODELS_DIR / "bundled"
CHUNK_CHARS = 1200  # corpus documents are cut into chunks this long so a batch mixes many files


def load_recipe(name_or_path: str) -> dict[str, Any]:
    path = Path(name_or_path)
    if not path.suffix:
        path = RECIPES_DIR / f"{name_or_path}.json"
    if not path.is_file():
        names = sorted(p.stem for p in RECIPES_DIR.glob("*.json"))
        raise InvalidArgument(f"no recipe {name_or_path!r}; use one of {', '.join(names)} or a path to a recipe JSON")
    return json.loads(path.read_text())


def load_tokenizer(spec: str):
    """A `tokenizers.Tokenizer` from a converter name ("llama-spm", "gpt-2"), ``model:NAME`` (an
    installed real model's own tokenizer, see ``omnidraft models``) or a tokenizer.json path."""
    from tokenizers import Tokenizer

    path = Path(spec)
    if spec.startswith("model:"):
        from omnidraft.models.sources import resolve

        path = resolve(spec.removeprefix("model:")) / "tokenizer.json"
    elif not path.suffix:
        from omnidraft.models.gguf_tokenizers import get_tokenizer_dir

        path = get_tokenizer_dir(spec) / "tokenizer.json"
    return Tokenizer.from_file(str(path)), path


def build_model(recipe: dict[str, Any], *, warm: bool = False) -> torch.nn.Module:
    """The recipe's architecture, seeded; with ``warm`` and a recipe ``init`` section, its weights
    start from a real model's (a kept subset of its layers)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    arch = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[recipe["arch"]]
    torch.manual_seed(recipe["train"]["seed"])
    model = arch[1](arch[0](**recipe["model"]))
    if warm and "init" in recipe:
        from .distill import warm_start

        warm_start(model, recipe["init"])
    return model


def _chunks(text: str) -> list[str]:
    out, start = [], 0
    while start < len(text):
        end = text.find("\n", start + CHUNK_CHARS)
        end = len(text) if end < 0 else end + 1
        out.append(text[start:end])
        start = end
    return out


def _domain_texts(domain: str, seed: int, limit_chars: int) -> list[str]:
    """Shuffled training pieces of `domain` until about `limit_chars` characters (held-out data excluded)."""
    if domain == "math":
        from omnidraft.models.streams import math_training_problems

        return [p.as_text() for p in math_training_problems(max(1, limit_chars // 250))]
    from omnidraft.models import data

    pieces = [c for d in data.train_documents(domain) for c in _chunks(d.text)]
    random.Random(f"{seed}-{domain}").shuffle(pieces)
    out, total = [], 0
    for p in pieces:
        if total >= limit_chars:
            break
        out.append(p)
        total += len(p)
    return out


def build_rows(recipe: dict[str, Any], tokenizer) -> np.ndarray:
    """All training rows [steps * batch, seq_len] as int32: packed, domain-mixed, seeded."""
    tr, d = recipe["train"], recipe["data"]
    seq, n_rows = d["seq_len"], tr["steps"] * tr["batch_size"]
    bos, eos = d.get("bos_id"), d["eos_id"]
    rows = []
    for domain, frac in sorted(d["mix"].items()):
        need = int(math.ceil(frac * n_rows)) * seq
        stream: list[int] = []
        chars = need * d.get("chars_per_token", 3)
        while len(stream) < need:
            texts = _domain_texts(domain, tr["seed"], chars)
            stream = []
            for enc in tokenizer.encode_batch(texts, add_special_tokens=False):
                stream.extend(([bos] if bos is not None else []) + enc.ids + [eos])
            if len(stream) < need:
                if chars > 50 * need * 4:
                    raise DataError(f"not enough {domain} training data for {need} tokens; lower the recipe's steps")
                chars *= 2
        arr = np.asarray(stream[:need], dtype=np.int32).reshape(-1, seq)
        rows.append(arr)
    allrows = np.concatenate(rows)
    perm = np.random.default_rng(tr["seed"]).permutation(len(allrows))
    return allrows[perm][:n_rows]


def domain_rows(recipe: dict[str, Any]) -> dict[str, int]:
    """How many of the recipe's training rows come from each domain (mirrors build_rows' layout)."""
    tr, d = recipe["train"], recipe["data"]
    n_rows = tr["steps"] * tr["batch_size"]
    labels = [dom for dom, frac in sorted(d["mix"].items()) for _ in range(int(math.ceil(frac * n_rows)))]
    perm = np.random.default_rng(tr["seed"]).permutation(len(labels))
    kept = [labels[i] for i in perm[:n_rows]]
    return {dom: kept.count(dom) for dom in sorted(d["mix"])}


def lr_at(step: int, tr: dict[str, Any]) -> float:
    """Linear warm-up then cosine decay to min_lr_ratio * lr; `step` counts from 0."""
    if step < tr["warmup_steps"]:
        return tr["lr"] * (step + 1) / tr["warmup_steps"]
    progress = (step - tr["warmup_steps"]) / max(1, tr["steps"] - tr["warmup_steps"])
    floor = tr["min_lr_ratio"]
    return tr["lr"] * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _make_optimizer(model: torch.nn.Module, tr: dict[str, Any]) -> torch.optim.AdamW:
    # A warm-started model keeps the pretrained tensors named in ``freeze`` (name prefixes) as they are.
    for n, p in model.named_parameters():
        p.requires_grad_(not any(n.startswith(f) for f in tr.get("freeze", ())))
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and p.requires_grad]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 and p.requires_grad]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": tr["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=tr["lr"],
        betas=(0.9, 0.95),
    )


def plot_losses(losses: list, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps, vals = zip(*losses) if losses else ((), ())
    ax.plot(steps, vals, lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def export_hf(model, recipe: dict[str, Any], tok_path: Path, out: Path, copy_tokenizer: bool = True) -> None:
    """HF folder: config.json, generation_config.json, model.safetensors (recipe's export dtype), tokenizer."""
    from transformers import GenerationConfig

    dtype = getattr(torch, recipe["export"]["dtype"])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    m = build_model(recipe)
    m.load_state_dict(model.state_dict())
    m.to(dtype).save_pretrained(str(tmp), safe_serialization=True)
    d = recipe["data"]
    GenerationConfig(
        bos_token_id=d.get("bos_id"), eos_token_id=d["eos_id"], pad_token_id=d["eos_id"], do_sample=False
    ).save_pretrained(str(tmp))
    if copy_tokenizer:
        shutil.copy(tok_path, tmp / "tokenizer.json")
    cfg = tok_path.parent / "tokenizer_config.json"
    if cfg.is_file():
        shutil.copy(cfg, tmp / "tokenizer_config.json")
    write_json(tmp / "training_summary.json", {"recipe": recipe})
    if out.exists():
        # keep files we do not produce (e.g. a locally installed tokenizer.json)
        for f in out.iterdir():
            if not (tmp / f.name).exists() and f.is_file():
                shutil.copy(f, tmp / f.name)
        shutil.rmtree(out)
    tmp.chmod(0o755)
    for f in tmp.iterdir():
        f.chmod(0o644)
    os.replace(tmp, out)


def train(
    recipe: dict[str, Any],
    *,
    work_dir: Path,
    out_dir: Path | None,
    resume: bool = True,
    stop_after: int | None = None,
    threads: int | None = None,
    quiet: bool = False,
    export_only: bool = False,
    device: str | None = "cpu",
    batch_scale: int = 1,
) -> list:
    """Runs (or resumes) a recipe; returns the loss history [(step, loss)]. `stop_after` simulates an
    interruption after that many steps (used by the tests).

    Steps count in the recipe's units whatever ``batch_scale``: an update at scale N takes the
    corpus rows and teacher records of N recipe steps as one batch N times larger, at the learning
    rate of the first of them. The data and its order are the recipe's, so an accelerator (``device``)
    runs the same recipe with a bigger batch and fewer updates, and a run resumes at another scale
    from any checkpoint."""
    from tqdm import tqdm

    tr = recipe["train"]
    if batch_scale < 1:
        raise InvalidArgument(f"--batch-scale must be 1 or more, got {batch_scale}")
    dev = resolve_device(device)
    torch.set_num_threads(threads or tr.get("threads", torch.get_num_threads()))
    if not export_only:
        check_memory(recipe, device=dev, batch_scale=batch_scale)
    # the model first: a warm start that does not fit the recipe is refused before the data is packed
    model = build_model(recipe, warm=True).to(dev)
    tokenizer, tok_path = load_tokenizer(recipe["tokenizer"])
    t0 = time.time()
    rows = torch.from_numpy(build_rows(recipe, tokenizer)).long()
    if not quiet:
        print(f"{recipe['name']}: {rows.numel():,} training tokens packed in {time.time() - t0:.1f}s", file=sys.stderr)
    teacher = load_teacher(recipe)
    if teacher is not None:
        teacher.to(dev)
    teachers = (
        CrossVocabTeachers(recipe["teachers"], tokenizer_path=tok_path, seed=tr["seed"])
        if "teachers" in recipe
        else None
    )
    lm_weight = recipe.get("teachers", {}).get("lm_weight", 1.0)
    proposed = teachers.token_counts(tr["steps"], recipe["model"]["vocab_size"]) if teachers is not None else None
    kept = head_tokens(recipe, rows.numpy(), proposed)
    kept = kept.to(dev) if kept is not None else None
    opt = _make_optimizer(model, tr)
    ckpt = work_dir / "checkpoints"
    if not resume and ckpt.exists():
        shutil.rmtree(ckpt)
    step, losses = load_checkpoint(ckpt, model, opt)
    model.train()
    B, every = tr["batch_size"], tr["checkpoint_every"]
    bar = tqdm(total=tr["steps"], initial=step, desc=recipe["name"], file=sys.stderr, disable=quiet, unit="step")
    t_start, tok_done = time.time(), 0
    seconds0 = checkpoint_seconds(ckpt)
    while step < tr["steps"] and not export_only:
        if stop_after is not None and step >= stop_after:
            bar.close()
            return losses
        n = min(batch_scale, tr["steps"] - step)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tr)
        batch = rows[step * B : (step + n) * B].to(dev)
        loss = torch.zeros((), device=dev)
        if lm_weight:
            loss = lm_weight * step_loss(model, batch, teacher=teacher, kd=recipe.get("teacher", {}), kept=kept)
        if teachers is not None:
            loss = loss + teachers.loss(model, step, kept, steps=n)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tr["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += n
        losses.append([step, round(loss.item(), 5)])
        tok_done += batch.numel()
        bar.update(n)
        bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tok_done / (time.time() - t_start):.0f}")
        if step // every != (step - n) // every or step == tr["steps"]:
            save_checkpoint(ckpt, step, model, opt, losses, seconds0 + time.time() - t_start)
            write_json(work_dir / "loss_curve.json", {"recipe": recipe["name"], "losses": losses})
    bar.close()
    if out_dir is not None:
        export_hf(model, recipe, tok_path, out_dir, copy_tokenizer=recipe.get("commit_tokenizer", True))
        plot_losses(
            losses,
            MODELS_DIR / f"loss_{recipe['name']}.png"
            if out_dir.resolve().parent == BUNDLED_DIR
            else work_dir / "loss.png",
            f"{recipe['name']} training loss",
        )
        write_token_counts(recipe, out_dir, rows.numpy(), proposed)
        write_json(
            out_dir / "loss_curve.json",
            {
                "recipe": recipe["name"],
                "losses": losses,
                "tokens": int(rows.numel()),
                "tokens_per_domain": {k: v * recipe["data"]["seq_len"] for k, v in domain_rows(recipe).items()},
                "train_seconds": round(checkpoint_seconds(ckpt), 1),
            },
        )
    return losses


def write_token_counts(
    recipe: dict[str, Any], out_dir: Path, rows: np.ndarray | None = None, proposed: np.ndarray | None = None
) -> Path:
    """``token_counts.json``: how often each token occurs in the recipe's training rows, plus how often
    its teacher passes ask for it (``CrossVocabTeachers.token_counts``): the ranking ``omnidraft
    export --draft-vocab N`` keeps a drafter's N most frequent tokens by, and the one a cut head
    (``train.head_tokens``) is trained on."""
    from omnidraft.export.draft_vocab import COUNTS_FILE, write_counts

    tokenizer, tok_path = load_tokenizer(recipe["tokenizer"])
    if rows is None:
        rows = build_rows(recipe, tokenizer)
    counts = np.bincount(np.asarray(rows).ravel(), minlength=recipe["model"]["vocab_size"])
    if proposed is None and "teachers" in recipe:
        teachers = CrossVocabTeachers(recipe["teachers"], tokenizer_path=tok_path, seed=recipe["train"]["seed"])
        proposed = teachers.token_counts(recipe["train"]["steps"], recipe["model"]["vocab_size"])
    source = f"training rows of recipe {recipe['name']}"
    if proposed is not None:
        counts, source = counts + proposed, f"training rows and teacher passes of recipe {recipe['name']}"
    write_counts(out_dir, counts, tok_path, source)
    return out_dir / COUNTS_FILE


def install_tokenizers() -> None:
    """Copies the converted tokenizer.json files into the bundled model folders (the Llama-2 one is
    not committed for licence reasons; this rebuilds it from the llama.cpp vocabulary)."""
    for name in ("drafter", "target", "drafter-teachers"):
        recipe = load_recipe(name)
        _, tok_path = load_tokenizer(recipe["tokenizer"])
        dest = BUNDLED_DIR / name
        if not dest.is_dir():
            raise ModelFolderError(f"{dest} is missing; run `python -m omnidraft.models.train --recipe {name}`")
        with atomic_path(dest / "tokenizer.json") as tmp:
            shutil.copy(tok_path, tmp)
        print(f"installed {dest / 'tokenizer.json'}", file=sys.stderr)


# glibc returns big freed blocks (logits, their gradients) to the OS and page-faults them back on the
# next step; keeping them in the heap doubled training throughput on the 2-core reference machine.
_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000"}


def main(argv: list[str] | None = None) -> int:
    if argv is None and any(os.environ.get(k) != v for k, v in _MALLOC_ENV.items()):
        os.execve(
            sys.executable,
            [sys.executable, "-m", "omnidraft.models.train", *sys.argv[1:]],
            {**os.environ, **_MALLOC_ENV},
        )
    from omnidraft.cli import quiet_third_party_logs

    quiet_third_party_logs()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", help="drafter, target, or a path to a recipe JSON")
    ap.add_argument("--resume", action="store_true", help="continue from the last checkpoint (default: start over)")
    ap.add_argument("--work-dir", type=Path, help="checkpoints and logs (default: models/checkpoints/<name>)")
    ap.add_argument("--out", type=Path, help="HF export folder (default: models/bundled/<name>)")
    ap.add_argument("--threads", type=int, help="torch threads (default: the recipe's)")
    ap.add_argument(
        "--device",
        default="cpu",
        help="where to train: cpu (default), cuda, cuda:N, mps, or auto (the first accelerator torch sees)",
    )
    ap.add_argument(
        "--batch-scale",
        type=int,
        default=1,
        metavar="N",
        help="train on N recipe steps' data per update (a batch N times larger, N times fewer updates; "
        "same data in the same order): for an accelerator",
    )
    ap.add_argument("--install-tokenizers", action="store_true", help="copy converted tokenizers into models/bundled/*")
    ap.add_argument("--export-only", action="store_true", help="export the last checkpoint without training further")
    ap.add_argument(
        "--count-tokens",
        action="store_true",
        help="only (re)write the bundled folder's token_counts.json from the recipe's training rows",
    )
    args = ap.parse_args(argv)
    from omnidraft.errors import OmnidraftError

    try:
        if args.install_tokenizers:
            install_tokenizers()
            return 0
        if not args.recipe:
            raise InvalidArgument("pass --recipe drafter|target (or --install-tokenizers)")
        recipe = load_recipe(args.recipe)
        if args.count_tokens:
            print(f"wrote {write_token_counts(recipe, args.out or BUNDLED_DIR / recipe['name'])}", file=sys.stderr)
            return 0
        work = args.work_dir or MODELS_DIR / "checkpoints" / recipe["name"]
        work.mkdir(parents=True, exist_ok=True)
        train(
            recipe,
            work_dir=work,
            out_dir=args.out or BUNDLED_DIR / recipe["name"],
            resume=args.resume or args.export_only,
            threads=args.threads,
            export_only=args.export_only,
            device=args.device,
            batch_scale=args.batch_scale,
        )
    except OmnidraftError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
