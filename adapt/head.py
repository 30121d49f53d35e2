"""Online training of the acceptance head (paper §4.2, Algorithms 3/4), cross-vocabulary.

Data, per decoded prompt, with no extra target call:
* features: the drafter backend records the final normed hidden state of the row each drafted token
  came from (``TorchEagerBackend.recorder``), i.e. the head's input at decode time;
* target-space labels: the loop's trace gives each round's draft, its translation spans and how many
  target tokens were accepted; ``on_verified`` gives the verification rows of the committed tokens,
  which include the row of the first rejected proposal. So the observed target positions of a round
  are the accepted ones plus the first rejection (acceptance is conditional on the earlier ones).
  Label of target token t at such a position: min(1, p(t)/q'(t)) at the decoding temperature, where
  q'(t) is the product of the drafter's sub-token probabilities (a merged n-gram). At temperature 0
  both distributions are one-hot in the limit and the label is 1 exactly when t was accepted.

Loss: weighted BCE on the *target-token* probability P(t) = prod_i sigmoid(z_i) over its drafter
sub-tokens, so the head learns per drafter token what the loop uses per target token.

Variants: ``joint`` steps the head on each distillation batch right after the drafter update;
``interleaved`` does too, pushes each batch into a FIFO replay buffer and steps the head after every
prompt that is not an update, on a random batch from it (the per-token biases and the output bias
only: the replayed features are stale, see ``HeadTrainer.after_prompt``). Labels are recomputed with the current drafter's
lm_head; features are the ones recorded at decode time (recomputing them would need a drafter
pass over every past round's context).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from omnidraft.errors import InvalidArgument
from omnidraft.runtime.draft_length.head_model import AcceptHead
from omnidraft.runtime.draft_length.policy import log_sigmoid, observed_targets

VARIANTS = ("joint", "interleaved")
# SpecDec++ weights rejected tokens 6:1 because its same-vocabulary drafts are mostly accepted; here
# most cross-vocabulary proposals are rejected (acceptance ~0.2-0.4), so the default is unweighted
# (calibrated probabilities, which the gamma rule and the calibration plot read as such).
REJECT_WEIGHT = 1.0


@dataclass
class HeadRecord:
    feats: torch.Tensor  # float32 [N, H] features of the drafted tokens at observed positions
    tokens: torch.Tensor  # int64 [N] the drafted drafter tokens
    group: torch.Tensor  # int64 [N] index of the target token each drafter token belongs to
    p_target: torch.Tensor  # float32 [G] p(t) at the decoding temperature (1/0 at temperature 0)
    observed: np.ndarray  # float32 [G] 1 = accepted, 0 = rejected
    predicted: np.ndarray  # float32 [G] the head's P(accept) at decode time (nan: not predicted)

    @property
    def size(self) -> int:
        return int(self.p_target.numel())


class HeadCollector:
    """Per prompt: ``start`` before decoding, ``on_verified`` from the loop, ``finish(result)`` after
    (the decode must run with ``trace=True``)."""

    def __init__(self, backend, temperature: float = 0.0) -> None:
        if not hasattr(backend, "recorder"):
            raise InvalidArgument("head training needs the drafter's Hugging Face folder (an eager backend)")
        self.backend, self.temperature = backend, temperature
        self.rows: list[np.ndarray] = []
        self.recorded: list[torch.Tensor] = []

    def start(self) -> None:
        self.backend.recorder = self.recorded = []
        self.rows = []

    def on_verified(self, tokens: list[int], rows: np.ndarray) -> None:
        self.rows.append(rows)

    def finish(self, result) -> HeadRecord | None:
        rec, self.backend.recorder = self.recorded, None
        if len(rec) != sum(len(r.draft) for r in result.rounds):
            return None  # the drafter was also called outside drafting: features cannot be matched up
        feats, toks, group, p_t, obs, pred = [], [], [], [], [], []
        offset = 0
        for rnd, rows in zip(result.rounds, self.rows):
            draft, spans, acc = rnd.draft, rnd.spans, rnd.accepted
            z = rnd.accept_logits
            for j, e, a, b, ok in observed_targets(spans, acc, len(rows)):
                g = len(p_t)
                for i in range(a, b):
                    feats.append(rec[offset + i])
                    toks.append(draft[i])
                    group.append(g)
                p_t.append(
                    math.prod(
                        _target_prob(rows[i], rnd.target_ids[i], self.temperature) for i in range(j, min(e, len(rows)))
                    )
                )
                obs.append(1.0 if ok else 0.0)
                pred.append(math.exp(sum(log_sigmoid(z[i]) for i in range(a, b))) if len(z) >= b else float("nan"))
            offset += len(draft)
        if not p_t:
            return None
        return HeadRecord(
            torch.stack(feats).detach().clone(),
            torch.tensor(toks),
            torch.tensor(group),
            torch.tensor(p_t, dtype=torch.float32),
            np.asarray(obs, np.float32),
            np.asarray(pred, np.float32),
        )


def _target_prob(row: np.ndarray, t: int, temperature: float) -> float:
    if temperature == 0:
        return 1.0 if int(np.argmax(row)) == t else 0.0
    z = row.astype(np.float64) / temperature
    z -= z.max()
    return float(np.exp(z[t]) / np.exp(z).sum())


def labels(rec: HeadRecord, lm_head: torch.nn.Module | None, temperature: float) -> torch.Tensor:
    """min(1, p(t)/q'(t)) per target token, q' from the current drafter (product over sub-tokens)."""
    if temperature == 0 or lm_head is None:
        return rec.p_target.clamp(0.0, 1.0)
    with torch.no_grad():
        logq = torch.log_softmax(lm_head(rec.feats).float() / temperature, dim=-1)
        lq = logq.gather(-1, rec.tokens[:, None]).squeeze(-1)
        log_qprime = torch.zeros(rec.size).index_add(0, rec.group, lq)
    return torch.minimum(torch.ones(()), rec.p_target / log_qprime.exp().clamp_min(1e-30))


def head_loss(
    head: AcceptHead,
    feats: torch.Tensor,
    group: torch.Tensor,
    n_groups: int,
    label: torch.Tensor,
    reject_weight: float = REJECT_WEIGHT,
    tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Weighted BCE on P(target token accepted) = prod sigmoid(z) over its drafter sub-tokens
    (z includes each drafted token's bias when ``tokens`` is given)."""
    z = head(feats) if tokens is None else head.logits(feats, tokens)
    logp = torch.zeros(n_groups).index_add(0, group, torch.nn.functional.logsigmoid(z))
    log1m = torch.log((-torch.expm1(logp)).clamp_min(1e-7))  # log(1 - P), stable for P -> 1
    w = label + reject_weight * (1.0 - label)
    return -(label * logp + reject_weight * (1.0 - label) * log1m).sum() / w.sum().clamp_min(1e-6)


@dataclass
class HeadTrainer:
    head: AcceptHead
    variant: str = "joint"
    # Adam moves every weight ~lr per step, so the MLP's logit moves ~lr x hidden size x |feature|:
    # at 1e-2 the bundled pair's code head became confidently wrong on held-out prompts (log loss
    # 1.6 vs 0.57 for a constant); the output bias is warm-started, so 1e-3 loses no speed of start.
    lr: float = 1e-3
    # The per-token biases each see a token's few rounds; they must move by whole units of log-odds
    # within a short stream (a token's acceptance ranges from ~0.1 to ~0.95).
    bias_lr: float = 0.1
    reject_weight: float = REJECT_WEIGHT
    steps: int = 8  # head steps per joint update / per interleaved prompt
    replay: int = 64  # interleaved: FIFO buffer size in prompts (paper's N)
    batch: int = 8  # interleaved: prompts per sampled batch (paper's B)
    temperature: float = 0.0
    seed: int = 0
    lm_head: torch.nn.Module | None = None
    losses: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise InvalidArgument(f"unknown --head-variant {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        if (
            not (self.lr > 0 and self.bias_lr > 0)
            or self.reject_weight <= 0
            or min(self.steps, self.replay, self.batch) < 1
        ):
            raise InvalidArgument(
                "--head-lr, the token-bias lr and --head-reject-weight must be > 0, head steps/replay/batch >= 1"
            )
        mlp = [p for n, p in self.head.named_parameters() if n != "token_bias"]
        groups = [{"params": mlp, "lr": self.lr}]
        if self.head.token_bias is not None:
            groups.append({"params": [self.head.token_bias], "lr": self.bias_lr})
        self.opt = torch.optim.AdamW(groups, weight_decay=0.0)
        self.buffer: deque[HeadRecord] = deque(maxlen=self.replay)
        self.rng = np.random.default_rng(self.seed)
        self.warm = False

    def warm_start(self, rec: HeadRecord | None) -> None:
        """Once, from the first prompt's labels: set the output bias so that the head predicts the
        observed mean acceptance (per drafter token: mean^(1 / drafter tokens per target token)).
        A fresh head otherwise starts from a fixed prior, and gradient steps at a small learning rate
        take most of a stream to move a bias by a few units; both variants get the same start."""
        if self.warm or rec is None or not rec.size:
            return
        lab = float(labels(rec, self.lm_head, self.temperature).mean())
        per_token = min(max(lab, 0.02), 0.98) ** (rec.size / rec.group.numel())
        with torch.no_grad():
            self.head.out.bias.fill_(math.log(per_token / (1.0 - per_token)))
        self.warm = True
        self.losses.append(
            {"warm_start": True, "mean_label": round(lab, 4), "bias": round(float(self.head.out.bias.detach()), 4)}
        )

    def step(self, records: list[HeadRecord], tag: dict | None = None, features_current: bool = True) -> float | None:
        """``features_current`` False (replayed records): step only what does not read the features,
        the per-token biases and the output bias (see ``after_prompt``)."""
        records = [r for r in records if r is not None and r.size]
        if not records:
            return None
        feats = torch.cat([r.feats for r in records])
        tokens = torch.cat([r.tokens for r in records])
        offsets = np.cumsum([0] + [r.size for r in records[:-1]])
        group = torch.cat([r.group + int(o) for r, o in zip(records, offsets)])
        label = torch.cat([labels(r, self.lm_head, self.temperature) for r in records])
        self.head.train()
        value = 0.0
        for _ in range(self.steps):
            self.opt.zero_grad()
            loss = head_loss(self.head, feats, group, label.numel(), label, self.reject_weight, tokens)
            if not torch.isfinite(loss):
                break
            loss.backward()
            if not features_current:
                for name, p in self.head.named_parameters():
                    if name not in ("token_bias", "out.bias"):
                        p.grad = None  # AdamW skips a parameter without a gradient
            self.opt.step()
            value = float(loss.detach())
        self.head.eval()
        self.losses.append({**(tag or {}), "variant": self.variant, "loss": round(value, 5), "targets": label.numel()})
        return value

    def after_prompt(self, rec: HeadRecord | None, prompt_index: int) -> None:
        """Interleaved: between distillation updates, a step on a replay batch. Its features were
        recorded by older drafters (recomputing them needs a drafter pass per past round), and the
        hidden-state MLP trained on them ranked held-out text tokens no better than chance, so
        replayed batches step only the per-token biases and the output bias,
        whose inputs do not go stale; labels are recomputed with the current drafter as before."""
        self.warm_start(rec)
        if self.variant == "interleaved" and self.buffer:
            pick = self.rng.choice(len(self.buffer), size=min(self.batch, len(self.buffer)), replace=False)
            self.step([self.buffer[int(i)] for i in pick], {"prompt": prompt_index}, features_current=False)

    def on_update(self, records: list[HeadRecord | None], update: int) -> None:
        """At a distillation update (every I prompts): joint steps on this batch; interleaved also
        steps on it (the only time its MLP sees features the drafter just produced), then pushes it
        into the replay buffer (oldest evicted)."""
        self.warm_start(next((r for r in records if r is not None and r.size), None))
        self.step(list(records), {"update": update})
        if self.variant == "interleaved":
            self.buffer.extend(r for r in records if r is not None and r.size)


def calibration(predicted: np.ndarray, observed: np.ndarray, bins: int = 10) -> list[dict]:
    """Predicted vs observed acceptance in equal-width probability bins (target tokens)."""
    keep = np.isfinite(predicted)
    p, o = predicted[keep], observed[keep]
    out = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        sel = (p >= lo) & ((p < hi) if b < bins - 1 else (p <= hi))
        if sel.any():
            out.append(
                {
                    "bin": [round(lo, 3), round(hi, 3)],
                    "count": int(sel.sum()),
                    "predicted": round(float(p[sel].mean()), 4),
                    "observed": round(float(o[sel].mean()), 4),
                }
            )
    return out


def draw_calibration(ax, curves: dict[str, list[dict]], title: str) -> None:
    """Reliability diagram on ``ax``: one line per curve; the diagonal is perfect calibration."""
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect calibration")
    for name, pts in curves.items():
        if pts:
            ax.plot([p["predicted"] for p in pts], [p["observed"] for p in pts], marker="o", label=name)
    ax.set_xlabel("predicted P(accept) of a target token")
    ax.set_ylabel("observed acceptance")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")


def plot_calibration(panels: dict[str, dict[str, list[dict]]], path, title: str) -> bool:
    """One reliability diagram per panel (e.g. per stream), side by side, in one PNG."""
    panels = {k: v for k, v in panels.items() if any(v.values())}
    if not panels:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from omnidraft.atomic import save_figure

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 5), squeeze=False)
    for ax, (name, curves) in zip(axes[0], panels.items()):
        draw_calibration(ax, curves, f"{title}: {name}" if name else title)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return True


def initial_head(backend, merged: Path, resumed: bool) -> AcceptHead:
    """Resume the head published beside a resumed adapter's merged drafter; else start from the
    head the drafter folder came with; else a fresh one."""
    import copy

    from omnidraft.runtime.draft_length.head_file import HEAD_JSON
    from omnidraft.runtime.draft_length.head_model import load_head

    if resumed and (Path(merged) / HEAD_JSON).is_file():
        return load_head(merged)[0]
    if getattr(backend, "head", None) is not None:
        return copy.deepcopy(backend.head)
    return AcceptHead(int(backend.model.config.hidden_size), vocab_size=int(backend.vocab_size))


def save_for(trainer: HeadTrainer, drafter_folder, info: dict | None = None) -> None:
    """Write the head beside a published drafter, tied to that drafter's weights."""
    from omnidraft.runtime.draft_length.head_file import drafter_identity
    from omnidraft.runtime.draft_length.head_model import save_head

    save_head(
        trainer.head,
        drafter_folder,
        drafter_identity(drafter_folder),
        {
            **(info or {}),
            "variant": trainer.variant,
            "lr": trainer.lr,
            "bias_lr": trainer.bias_lr,
            "reject_weight": trainer.reject_weight,
            "head_updates": len(trainer.losses),
        },
    )


def export_with_head(drafter_folder, folder, max_seq_len: int, quant: str = "fp32"):
    """Re-lower a published drafter with its head in the ONNX graph; the export pipeline swaps the
    folder in only after its gate passed."""
    from omnidraft.export.pipeline import export_model

    from .delta import recover_dir

    final = Path(folder)
    recover_dir(final)
    export_model(drafter_folder, "onnx", quant, max_seq_len, final, progress=False, accept_head=drafter_folder)
    return final
