"""What a drafter recipe takes from real models: a warm start (a real model's kept layers), a
same-vocabulary teacher whose distributions it is distilled on, and a head cut to the tokens it is
deployed with. Used by ``omnidraft.models.train`` when a recipe has ``init``, ``teacher`` or
``train.head_tokens``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from omnidraft.errors import InvalidArgument, ModelFolderError

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.*)")  # a layer's weight: its index, the rest of its name


def warm_start(model: torch.nn.Module, init: dict[str, Any]) -> None:
    """Copies a real model's weights into ``model``: its layers ``init["layers"]`` (in that order)
    become layers 0.., everything outside the layers (embedding, final norm, head) is copied as it
    is. A pretrained embedding and head are most of what a small drafter cannot learn on a CPU.
    With ``init["widen"]`` the recipe's model may be wider than the source (hidden size, heads,
    MLP): the source is embedded so that the wider model computes the same logits (``_widen``).
    A ``null`` in ``init["layers"]`` is a new layer that starts as the identity (``_identity_layer``),
    so a deeper model also computes the same logits at step 0; a repeated index copies that layer."""
    from omnidraft.models.sources import resolve

    folder = resolve(init["model"])
    try:
        src = load_file(str(folder / "model.safetensors"))
    except (OSError, SafetensorError) as exc:
        raise ModelFolderError(f"cannot read the warm start's weights in {folder} ({exc})") from exc
    layers = init["layers"]
    have = {int(m.group(1)) for n in src if (m := _LAYER.match(n))}
    if len(layers) != model.config.num_hidden_layers:
        raise InvalidArgument(
            f"init.layers lists {len(layers)} layers for a model of {model.config.num_hidden_layers} "
            "(num_hidden_layers); list one entry per layer: a layer of the warm start, or null for a new one"
        )
    if bad := [i for i in layers if i is not None and (type(i) is not int or i not in have)]:
        raise InvalidArgument(
            f"init.layers names layer {bad[0]!r}, which {init['model']} does not have "
            f"(it has layers 0-{max(have, default=-1)}); use their indices, or null for a new layer"
        )
    mapped = {}
    for name, t in src.items():
        m = _LAYER.match(name)
        if m is None:
            mapped[name] = t
            continue
        for j, i in enumerate(layers):
            if i == int(m.group(1)):
                mapped[f"model.layers.{j}.{m.group(2)}"] = t
    own = model.state_dict()
    if init.get("widen"):
        mapped = _widen(mapped, own, model.config, folder, init["model"])
    for j, i in enumerate(layers):
        if i is None:
            mapped.update(_identity_layer(own, j))
    wrong = [n for n, t in mapped.items() if n in own and own[n].shape != t.shape]
    missing = [
        n for n in own if n not in mapped and not (n == "lm_head.weight" and "model.embed_tokens.weight" in mapped)
    ]
    if wrong or missing:
        raise ModelFolderError(
            f"the recipe's model does not fit the weights of {init['model']} "
            f"({'shape differs: ' + wrong[0] if wrong else 'missing: ' + missing[0]}); copy its config into the "
            "recipe, or set init.widen to grow it"
        )
    model.load_state_dict({n: t for n, t in mapped.items() if n in own}, strict=False)


# Weights that write into the residual stream (the embedding, o_proj, down_proj), and an untied head:
# outside the source's block they start at zero, so nothing new reaches the old dims or the logits.
_WRITERS = ("embed_tokens.weight", "o_proj.weight", "down_proj.weight", "lm_head.weight")


def _widen(mapped: dict[str, torch.Tensor], own: dict[str, torch.Tensor], config, folder, name: str) -> dict:
    """The source's weights inside the wider model's, computing the same function at the start:
    new residual dims are written by nothing (writers zero outside the source block) and so stay 0;
    readers keep their random init outside the block, so gradients reach the new dims and units
    from the first step; RMSNorm weights are scaled by sqrt(old/new width), because the zeros in
    the new dims lower the root mean square by exactly that. Heads keep their width and their
    kv-group, so old head i still attends with old kv head i."""
    cfg = json.loads((folder / "config.json").read_text())
    hd_src = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    group_src = cfg["num_attention_heads"] // cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    group = config.num_attention_heads // config.num_key_value_heads
    if head_dim != hd_src or group != group_src:
        raise ModelFolderError(
            f"cannot widen {name}: the recipe must keep its head width ({hd_src}) and heads per kv head ({group_src})"
        )
    scale = math.sqrt(cfg["hidden_size"] / config.hidden_size)
    out = {}
    for n, t in mapped.items():
        if n not in own or own[n].shape == t.shape:
            out[n] = t
            continue
        if any(a < b for a, b in zip(own[n].shape, t.shape, strict=True)):
            raise ModelFolderError(f"cannot widen {name}: the recipe's {n} is smaller than the source's")
        block = tuple(slice(0, d) for d in t.shape)
        if n.endswith("norm.weight"):
            w = torch.ones_like(own[n])
            w[block] = t.to(w.dtype) * scale
        else:
            w = torch.zeros_like(own[n]) if n.endswith(_WRITERS) else own[n].clone()
            w[block] = t.to(w.dtype)
        out[n] = w
    return out


def _identity_layer(own: dict[str, torch.Tensor], j: int) -> dict[str, torch.Tensor]:
    """Layer ``j`` as a residual block that adds nothing: its writers (o_proj, down_proj) are zero,
    its readers keep their random init, so its first gradients reach o_proj and down_proj and the
    rest follows; the norms start at 1."""
    prefix = f"model.layers.{j}."
    out = {}
    for n, t in own.items():
        if n.startswith(prefix):
            out[n] = torch.zeros_like(t) if n.endswith(_WRITERS) else t.clone()
    return out


def load_teacher(recipe: dict[str, Any]) -> torch.nn.Module | None:
    """The recipe's same-vocabulary teacher (``teacher.model``, a real model name or folder), frozen."""
    if "teacher" not in recipe:
        return None
    from transformers import AutoModelForCausalLM

    from omnidraft.models.sources import resolve

    folder = resolve(recipe["teacher"]["model"])
    teacher = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    if teacher.config.vocab_size != recipe["model"]["vocab_size"]:
        raise InvalidArgument(
            f"teacher {recipe['teacher']['model']} has {teacher.config.vocab_size} tokens, the recipe's model "
            f"{recipe['model']['vocab_size']}: a recipe teacher must share the drafter's vocabulary"
        )
    teacher.requires_grad_(False)
    return teacher


def head_tokens(recipe: dict[str, Any], rows: np.ndarray, extra: np.ndarray | None = None) -> torch.Tensor | None:
    """The ``train.head_tokens`` most frequent token ids of the training rows (plus ``extra``
    counts: the tokens a teacher pass trains it to propose), sorted, or None for the whole
    vocabulary. A drafter is deployed with its head cut to the same ranking (``export --draft-vocab
    N`` reads the counts this run writes), so training the cut head is training the deployed model,
    at a fraction of a 32k-49k-row head's cost."""
    n = recipe["train"].get("head_tokens")
    if n is None:
        return None
    counts = np.bincount(np.asarray(rows).ravel(), minlength=recipe["model"]["vocab_size"])
    if extra is not None:
        counts = counts + extra
    ids = np.arange(len(counts))
    return torch.from_numpy(np.sort(np.lexsort((ids, -counts))[:n]))


def _logits(model: torch.nn.Module, batch: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
    hidden = model.model(input_ids=batch).last_hidden_state[:, :-1]
    weight = model.get_output_embeddings().weight
    return hidden @ (weight if kept is None else weight[kept]).T


def step_loss(
    model: torch.nn.Module, batch: torch.Tensor, *, teacher: torch.nn.Module | None, kd: dict, kept: torch.Tensor | None
) -> torch.Tensor:
    """Next-token NLL, or with a teacher ``(1 - w) * NLL + w * T^2 * KL(teacher_T || student_T)``:
    the teacher's whole distribution is a far denser signal per token than the one label. With a
    cut head both distributions live on the kept tokens, and labels outside them are skipped."""
    labels = batch[:, 1:]
    if kept is not None:
        remap = torch.full((model.config.vocab_size,), -100, dtype=torch.long, device=batch.device)
        remap[kept] = torch.arange(len(kept), device=batch.device)
        labels = remap[labels]
    logits = _logits(model, batch, kept)
    labels = labels.flatten()
    # a row whose labels all fall outside the cut head adds nothing (not NaN) to the NLL
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels, ignore_index=-100, reduction="sum")
    nll = nll / (labels != -100).sum().clamp(min=1)
    if teacher is None:
        return nll
    w, temp = kd.get("weight", 1.0), kd.get("temperature", 1.0)
    with torch.no_grad():
        t_logp = torch.log_softmax(_logits(teacher, batch, kept).float() / temp, dim=-1)
    s_logp = torch.log_softmax(logits.float() / temp, dim=-1)
    kl = torch.nn.functional.kl_div(s_logp.flatten(0, 1), t_logp.flatten(0, 1), log_target=True, reduction="batchmean")
    return (1 - w) * nll + w * temp * temp * kl


def _first_answers(ts, spec: dict[str, Any]):
    """The set's first ``answers`` answers in prompt order (all of them without it), so one long pass
    can train drafters on its prefixes and measure how acceptance grows with the answers seen."""
    n = spec.get("answers")
    if n is None:
        return ts
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgument(f"recipe teachers.sets answers must be a whole number >= 1 (got {n!r})")
    if n > len(ts.records):
        raise InvalidArgument(
            f"recipe teachers.sets asks for {n} answers of {spec['shards']}, which holds {len(ts.records)}; "
            "lower answers or run the pass with more --prompts"
        )
    return replace(ts, records=ts.records[:n])


class CrossVocabTeachers:
    """Recipe ``teachers``: stored teacher passes of real targets in other vocabularies
    (models/teacher_shards.py), each a term of the paper's hybrid loss through that teacher's direct
    map and n-grams. A step draws ``records_per_step`` records of every teacher, in an order that is
    a pure function of the seed and the step (an interrupted run resumes bit-identically); a batch
    of several steps (``loss(..., steps=n)``) holds exactly their records. ``temperature`` (default
    1) sharpens every stored teacher distribution before its KL (adapt/loss.py: sharpen), and
    ``divergence`` ("reverse", the paper's, or "forward") picks which KL."""

    def __init__(self, spec: dict[str, Any], *, tokenizer_path, seed: int) -> None:
        import hashlib

        from omnidraft.adapt.loss import DIVERGENCES

        from .teacher_store import load_teacher_passes

        sha = hashlib.sha256(tokenizer_path.read_bytes()).hexdigest()
        self.per_step = int(spec.get("records_per_step", 8))
        self.seq_len = int(spec.get("seq_len", 256))
        self.temperature = spec.get("temperature", 1.0)
        if self.per_step < 1 or self.seq_len < 8 or not spec.get("sets"):
            raise InvalidArgument(
                "recipe teachers needs sets (a list of {shards, weight}; shards one pass folder or a list of one teacher's passes), records_per_step >= 1 and seq_len >= 8"
            )
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, int | float) or self.temperature <= 0:
            raise InvalidArgument(f"recipe teachers.temperature must be a number > 0 (got {self.temperature!r})")
        self.divergence = spec.get("divergence", "reverse")
        if self.divergence not in DIVERGENCES:
            raise InvalidArgument(
                f'recipe teachers.divergence must be "reverse" or "forward" (got {self.divergence!r})'
            )
        self.sets = [
            _first_answers(load_teacher_passes(s["shards"], drafter_tokenizer_sha256=sha), s) for s in spec["sets"]
        ]
        self.weights = [float(s.get("weight", 1.0)) for s in spec["sets"]]
        self.seed = seed
        self._perms: dict[tuple[int, int], np.ndarray] = {}

    def _records(self, i: int, step: int, steps: int = 1) -> list:
        recs = self.sets[i].records
        out = []
        for g in range(step * self.per_step, (step + steps) * self.per_step):
            epoch, r = divmod(g, len(recs))
            if (i, epoch) not in self._perms:
                self._perms = {key: p for key, p in self._perms.items() if key[1] >= epoch - 1}
                self._perms[(i, epoch)] = np.random.default_rng([self.seed, i, epoch]).permutation(len(recs))
            out.append(recs[self._perms[(i, epoch)][r]])
        return out

    def token_counts(self, steps: int, vocab: int) -> np.ndarray:
        """How often a run of ``steps`` steps asks the drafter to propose each token: the token after
        every loss row, once per draw of its record (the draws ``_records`` makes)."""
        counts = np.zeros(vocab, dtype=np.int64)
        for i, ts in enumerate(self.sets):
            n, total = len(ts.records), steps * self.per_step
            times = np.full(n, total // n, dtype=np.int64)
            times[np.random.default_rng([self.seed, i, total // n]).permutation(n)[: total % n]] += 1
            for rec, t in zip(ts.records, times):
                rows = np.concatenate([rec.dm_rows, rec.ng_rows]).astype(np.int64) + 1
                np.add.at(counts, rec.ids[rows[rows < len(rec.ids)]], t)
        return counts

    def _cut(
        self, i: int, kept: torch.Tensor | None, vocab: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Teacher ``i``'s intersection as columns of the (cut) head, the map from intersection
        index to kept intersection index (-1: not kept) and from drafter id to head column."""
        inter = torch.from_numpy(self.sets[i].inter)
        if kept is None:
            return inter.to(device), None, None
        column = torch.full((vocab,), -1, dtype=torch.long)
        column[kept.cpu()] = torch.arange(len(kept))
        cols = column[inter]
        keep = cols >= 0
        to_kept = torch.full((len(inter),), -1, dtype=torch.long)
        to_kept[keep] = torch.arange(int(keep.sum()))
        return cols[keep].to(device), to_kept.to(device), column.to(device)

    def loss(
        self, model: torch.nn.Module, step: int, kept: torch.Tensor | None = None, *, steps: int = 1
    ) -> torch.Tensor:
        """The weighted hybrid losses. Only the rows that carry a loss go through the head (most of a
        record is its prompt and padding), and with a cut head (``kept``, sorted drafter ids) the
        intersection is restricted to the kept tokens: the drafter as deployed can propose no other,
        and its q' is renormalised over what is left. A teacher top-K entry outside the head is out
        of q's support, so it drops out of the KL; an n-gram label outside the head drops its row."""
        from omnidraft.adapt.loss import hybrid_loss, make_batch, sharpen

        weight = model.get_output_embeddings().weight
        head = weight if kept is None else weight[kept]
        total = torch.zeros((), device=weight.device)
        for i, (ts, w) in enumerate(zip(self.sets, self.weights)):
            b = make_batch(self._records(i, step, steps), "hybrid", ts.k, seq_len=self.seq_len).to(weight.device)
            rows = (b.dm_mask > 0) | (b.ng_mask > 0)
            hidden = model.model(input_ids=b.ids).last_hidden_state[rows]
            dm, idx, logp, tail = b.dm_mask[rows], b.topk_idx[rows], b.topk_logp[rows], b.tail[rows]
            ng, labels = b.ng_mask[rows], b.labels[rows]
            if self.temperature != 1:
                logp, tail = sharpen(logp, tail, len(ts.inter), self.temperature)
            inter, to_kept, column = self._cut(i, kept, weight.shape[0], weight.device)
            if to_kept is not None:
                idx = to_kept[idx]
                logp = torch.where(idx >= 0, logp, tail.unsqueeze(-1))  # its term is q * 0
                idx = idx.clamp(min=0)
                labels = column[labels]
                ng = torch.where(labels >= 0, ng, torch.zeros((), device=ng.device))
                labels = labels.clamp(min=0)
            logits = (hidden @ head.T).unsqueeze(0)
            one = [t.unsqueeze(0) for t in (dm, idx, logp, tail, ng, labels)]
            total = total + w * hybrid_loss(logits, inter, *one, b.lam, divergence=self.divergence)
        return total
