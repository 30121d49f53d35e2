"""Bridge to online adaptation (omnidraft.adapt) for the rows l-dm, hybrid, hybrid+lora.

Each adapted row is one pass of ``omnidraft.adapt.online.OnlineAdapter`` over train prompts (fresh
state: no adapter resumed from an earlier run), then the published merged drafter folder is loaded
(exported first for ort / executorch) and measured on the held-out test prompts with the cache that
pass built. The bench never fakes these rows: when the adaptation API is missing or incompatible,
each is reported with ``status: "not available: ..."``.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omnidraft.bench.engine import Engine
    from omnidraft.bench.method_table import Bench

# method -> AdaptConfig options by their flat names (AdaptConfig.from_flat), which the row's `adaptation`
# summary repeats; the paper's L_DM and hybrid rows are full fine-tuning, +LoRA rank 32.
# hybrid+adaptive: the hybrid pass also trains the acceptance head (interleaved: the paper's faster
# variant) while decoding with it, gamma tuned from tokens/s; its row decodes with --draft-len auto.
# Short-stream settings: the paper's lr (2e-5 full / 1e-4 LoRA, one step per 8 prompts) is for
# thousands of prompts; a bench pass sees a few dozen, so each update takes 8 AdamW steps at a higher
# lr, distilling a sharpened target (T = 0.1, near the paper's 0.01). Measured on math, 64 train /
# 16 test prompts (`omnidraft adapt --stream math --train-limit 64 --eval-limit 16 ...`): full FT at
# 1e-3 x 8 steps 0.010 -> 0.090; LoRA at 2e-3 x 2 steps 0.011 -> 0.040; LoRA at 5e-3 x 8 steps fell to 0.004.
FULL = {"mode": "full", "lr": 1e-3, "steps_per_update": 8, "distill_temperature": 0.1, "engine": "eager"}
METHODS = {
    "l-dm": {**FULL, "loss": "dm"},
    "hybrid": {**FULL, "loss": "hybrid"},
    "hybrid+lora": {
        "mode": "lora",
        "loss": "hybrid",
        "rank": 32,
        "lr": 1e-3,
        "steps_per_update": 8,
        "distill_temperature": 0.1,
    },
    "hybrid+adaptive": {
        **FULL,
        "loss": "hybrid",
        "train_head": True,
        "draft_len": "auto",
        "head_variant": "interleaved",
        "tune_gamma": True,
    },
}
NEEDS = ("OnlineAdapter",)
# A drafter trained against the real targets (a recipe with teachers) starts where a short pass at 1e-3
# would pull it away from them; at 1e-4 its pass acceptance rises instead (docs/decisions.md, set 19).
WARM_LR = 1e-4


def short_pass_lr(drafter: Path) -> float:
    """The lr of a short pass over ``drafter``: the methods' own, or WARM_LR for a teacher-trained one."""
    try:
        recipe = json.loads((Path(drafter) / "training_summary.json").read_text()).get("recipe")
    except (OSError, ValueError, AttributeError):
        recipe = None
    return WARM_LR if isinstance(recipe, dict) and recipe.get("teachers") else FULL["lr"]


def _online():
    try:
        return importlib.import_module("omnidraft.adapt.online")
    except ImportError:
        return None


def unavailable_reason() -> str | None:
    mod = _online()
    if mod is None:
        return "not available: omnidraft.adapt missing"
    missing = [n for n in NEEDS if not hasattr(mod, n)]
    if missing:
        return f"not available: omnidraft.adapt.online has no {', '.join(missing)}"
    return None


def replayable(method: str) -> bool:
    """Adapted drafters are plain HF folders, so they can be exported and replayed on any backend."""
    return method in METHODS and unavailable_reason() is None


def _pass(bench: Bench, stream: str, method: str, prompts: list[str], draft_len: int, target: Path) -> dict:
    """Adapt once per (stream, method) and remember where the merged drafter and cache are.

    ``target`` is the deployed target (the bench backend's export): the drafter learns the tokens the
    target it will be verified by writes, not those of the fp32 Hugging Face target, whose greedy
    choices the int8 export does not always share."""
    done = bench.adapted
    if (stream, method) in done:
        return done[(stream, method)]
    from omnidraft.adapt.config import AdaptConfig
    from omnidraft.bench.engine import adaptation_pass

    mod = _online()
    s = bench.s
    over = dict(METHODS[method])
    over["lr"] = s.adapt_lr if s.adapt_lr is not None else short_pass_lr(bench.pair.drafter)
    if over.get("train_head"):
        over["gamma"] = s.gamma
    cfg = AdaptConfig.from_flat(
        max_new_tokens=s.max_new_tokens, draft_len=over.pop("draft_len", draft_len), splits=s.splits, **over
    )
    state = s.out / "state" / "adapt" / f"{stream}.{method}"
    shutil.rmtree(state, ignore_errors=True)  # the bench's own scratch: never resume an old adapter
    ad = mod.OnlineAdapter(bench.pair.drafter, target, state, cfg)
    log = adaptation_pass(ad, prompts, f"{stream}: adapt {method}", bench.progress)
    acc, prop = sum(log.accepted), sum(log.proposed)
    done[(stream, method)] = info = {
        "drafter": ad.dir / "drafter",
        "cache": ad.cache_path if Path(ad.cache_path).is_file() else None,
        "memory": ad.memory_path if Path(ad.memory_path).is_file() else None,
        "summary": {
            "train_prompts": len(log.acceptance),
            "updates": ad.updates,
            "engine": ad.trainer.engine,
            "stream_acceptance": round(acc / prop, 4) if prop else None,
            "rollbacks": sum(1 for e in log.events if e.get("action") == "rolled-back"),
            # per train prompt, as decoded live during the pass: the learning curve (adaptation.png)
            "per_prompt": {"accepted": list(log.accepted), "proposed": list(log.proposed)},
            "decode_seconds": round(log.decode_seconds, 1),
            "train_seconds": round(log.train_seconds, 1),
            **{k: v for k, v in METHODS[method].items()},
            "lr": over["lr"],
        },
    }
    if getattr(ad, "gamma_ctl", None) is not None:
        info["summary"]["gamma_after"] = round(ad.gamma_ctl.gamma, 4)
        info["summary"]["k_max_after"] = ad.gamma_ctl.k_max
    return info


def for_backend(
    bench: Bench,
    eng: Engine,
    stream: str,
    method: str,
    prompts: list[str] | None = None,
    draft_len: int | None = None,
):
    """(drafter LoadedModel for ``eng``'s backend, a fresh copy of the pass's cache); adapts on first use."""
    from omnidraft.bench.bundled import drafter_export
    from omnidraft.bench.demo import BACKENDS
    from omnidraft.bench.engine import load_drafter

    info = _pass(bench, stream, method, prompts or [], draft_len or 4, eng.paths[1])
    fmt, quant = BACKENDS[eng.backend]
    folder = Path(info["drafter"])
    from omnidraft.runtime.draft_length.head_file import HEAD_JSON

    head = folder if (folder / HEAD_JSON).is_file() else None  # ONNX drafters carry it in the graph
    path = (
        folder
        if fmt is None
        else drafter_export(
            folder,
            fmt,
            quant,
            bench.s.max_seq_len,
            bench.progress,
            accept_head=head if fmt == "onnx" else None,
            draft_vocab=bench.s.draft_vocab,
        )
    )
    cache = eng.load_cache(Path(info["cache"])) if info["cache"] else eng.new_cache()
    return load_drafter(path), cache


def adapt(bench: Bench, eng: Engine, stream: str, method: str, train, draft_len: int):
    """Run the adaptation pass over the train prompts; returns (drafter, cache, summary) for ``eng``."""
    k_max = max(bench.s.sweep_ks)
    prompts = [p.prompt for p in train if eng.fits(p.prompt, bench.s.max_new_tokens, k_max)][: bench.s.adapt_prompts]
    drafter, cache = for_backend(bench, eng, stream, method, prompts, draft_len)
    return drafter, cache, bench.adapted[(stream, method)]["summary"]
