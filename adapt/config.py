"""The options of one online adaptation run, grouped by what they steer, and their validation.

``AdaptConfig.flat`` names every option once (``head.lr`` is ``head_lr``), as ``omnidraft adapt``'s
flags and the bench's method tables spell them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from omnidraft.errors import InvalidArgument

from .buffer import TOP_K
from .loss import DIVERGENCES, LOSSES

# Options checked for finiteness, by their flat names (see AdaptConfig.flat).
FLOATS = ("lr", "guard_margin", "distill_temperature", "gamma", "head_lr", "head_bias_lr", "head_reject_weight")


def _flat(name: str, default):
    """A field whose flat name (see AdaptConfig.flat) differs from its own: the group already says it."""
    return field(default=default, metadata={"flat": name})


@dataclass
class UpdateSchedule:
    """When and how the drafter's weights move."""

    mode: str = "lora"  # "lora" | "full"
    rank: int = 32
    every: int = 8  # prompts per update (= batch size)
    steps_per_update: int = 1
    lr: float | None = None  # default: 1e-4 (LoRA) / 2e-5 (full)
    engine: str = "executorch"  # LoRA gradients: "executorch" | "eager"
    seq_len: int = 256  # drafter tokens per training row (fixed program shape)
    seed: int = 0


@dataclass
class Distillation:
    """What an update minimises."""

    loss: str = "hybrid"  # one of LOSSES, or "none": the drafter stays frozen (acceptance head only)
    top_k: int = TOP_K
    temperature: float = _flat("distill_temperature", 1.0)  # of the target distribution p in the KL term
    divergence: str = "reverse"  # the KL on DM positions: the paper's KL(q' || p), or "forward" KL(p || q')
    splits: bool = True  # the loop may propose split drafter tokens; their labels join the NLL term


@dataclass
class StreamDecoding:
    """How the pass decodes the stream it learns from."""

    max_new_tokens: int = 48
    draft_len: int | str = 4  # "auto": decode with the acceptance head
    gamma: float = 0.5
    max_draft_len: int = 16
    tune_gamma: bool = False  # auto: tune gamma and K_max online from measured costs (runtime.gamma)


@dataclass
class HeadTraining:
    """The acceptance head trained online beside the drafter (joint or interleaved)."""

    train: bool = _flat("train_head", False)
    variant: str = _flat("head_variant", "joint")
    lr: float = _flat("head_lr", 1e-3)
    bias_lr: float = _flat("head_bias_lr", 0.1)
    reject_weight: float = _flat("head_reject_weight", 1.0)
    steps: int = _flat("head_steps", 8)
    replay: int = _flat("head_replay", 64)
    batch: int = _flat("head_batch", 8)


@dataclass
class PublishPolicy:
    """When an update reaches the per-target state, behind the drift guard, and what is re-lowered."""

    every: int = _flat("publish_every", 8)  # updates between guarded publishes (and once at the end)
    guard_window: int = 8
    guard_margin: float = 0.02
    export_formats: tuple[str, ...] = ()
    export_max_seq_len: int = 512


@dataclass
class AdaptConfig:
    """One adaptation run's options, grouped by what they steer."""

    schedule: UpdateSchedule = field(default_factory=UpdateSchedule)
    distill: Distillation = field(default_factory=Distillation)
    decoding: StreamDecoding = field(default_factory=StreamDecoding)
    head: HeadTraining = field(default_factory=HeadTraining)
    publish: PublishPolicy = field(default_factory=PublishPolicy)

    def _leaves(self):
        """(flat name, group, attribute) of every option."""
        for g in fields(self):
            group = getattr(self, g.name)
            for f in fields(group):
                yield f.metadata.get("flat", f.name), group, f.name

    def flat(self) -> dict:
        """The options under one unique name each (head.lr: head_lr), as report.json lists them and as
        the `omnidraft adapt` flags spell most of them."""
        return {name: getattr(group, attr) for name, group, attr in self._leaves()}

    @classmethod
    def from_flat(cls, **options) -> AdaptConfig:
        """The config of options named as in :meth:`flat` (the bench's method tables, whose keys its
        report repeats); the rest keep their defaults."""
        cfg = cls()
        where = {name: (group, attr) for name, group, attr in cfg._leaves()}
        for name, value in options.items():
            if name not in where:
                raise TypeError(f"unknown adaptation option {name!r}")
            setattr(*where[name], value)
        return cfg

    def validate(self) -> None:
        opts = self.flat()
        for name in FLOATS:
            v = opts[name]
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v)):
                raise InvalidArgument(f"--{name.replace('_', '-')} must be a finite number (got {v})")
        s, d, dec, h = self.schedule, self.distill, self.decoding, self.head
        if isinstance(s.seed, bool) or not isinstance(s.seed, int) or s.seed < 0:
            raise InvalidArgument(f"--seed must be an integer >= 0 (got {s.seed})")
        if s.mode not in ("lora", "full"):
            raise InvalidArgument(f"unknown adaptation mode {s.mode!r}; use lora or full")
        if d.loss not in LOSSES and d.loss != "none":
            raise InvalidArgument(f"unknown --loss {d.loss!r}; choose one of {', '.join(LOSSES)}, none")
        if d.divergence not in DIVERGENCES:
            raise InvalidArgument(f"unknown --divergence {d.divergence!r}; choose one of {', '.join(DIVERGENCES)}")
        if d.loss == "none" and not h.train:
            raise InvalidArgument("--loss none trains nothing; add --train-head to train the acceptance head only")
        from omnidraft.runtime.draft_length.policy import validate_adaptive

        validate_adaptive(dec.draft_len, dec.gamma, dec.max_draft_len)
        if h.train:
            from .head import VARIANTS

            if h.variant not in VARIANTS:
                raise InvalidArgument(f"unknown --head-variant {h.variant!r}; choose one of {', '.join(VARIANTS)}")
            if not (h.lr > 0 and h.bias_lr > 0 and h.reject_weight > 0) or min(h.steps, h.replay, h.batch) < 1:
                raise InvalidArgument(
                    "--head-lr, --head-bias-lr and --head-reject-weight must be > 0, --head-steps/--head-replay/"
                    "--head-batch >= 1"
                )
        if s.mode == "lora" and s.rank < 1:
            raise InvalidArgument(f"--lora-rank must be >= 1 (got {s.rank})")
        for name in (
            "every",
            "steps_per_update",
            "seq_len",
            "max_new_tokens",
            "guard_window",
            "publish_every",
            "top_k",
        ):
            if opts[name] < 1:
                raise InvalidArgument(f"{name.replace('_', '-')} must be >= 1 (got {opts[name]})")
        if s.lr is not None and not s.lr > 0:
            raise InvalidArgument(f"--lr must be > 0 (got {s.lr})")
        if not d.temperature > 0:
            raise InvalidArgument(f"--distill-temperature must be > 0 (got {d.temperature})")
        if self.publish.guard_margin < 0:
            raise InvalidArgument(f"--guard-margin must be >= 0 (got {self.publish.guard_margin})")
