"""Algorithm 2: decode the stream with cross-vocabulary SpD, buffer on-policy data, update the
drafter every I prompts, publish guarded deltas per target.

Publishing (every ``publish_every`` updates and at the end of the stream) runs the drift guard on
the last ``guard_window`` prompts: the candidate weights and the last published weights re-decode
them greedily (same cache copy); a candidate that loses more than ``guard_margin`` acceptance is
rolled back (weights restored, optimizer moments reset) and reported. Otherwise the delta, the
n-gram cache and the merged drafter are written for the target, each atomically.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import torch

from omnidraft.errors import ContextOverflow, InvalidArgument
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.session import open_pair

from . import delta
from .buffer import TOP_K, Collector, Record
from .guard import Measure, measure
from .loss import DIVERGENCES, LOSSES
from .trainer import Trainer, wrap_lora

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


@dataclass
class StreamLog:
    acceptance: list[float] = field(default_factory=list)  # per prompt, as decoded live
    accepted: list[int] = field(default_factory=list)
    proposed: list[int] = field(default_factory=list)
    losses: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    skipped_prompts: int = 0
    buffer_bytes: int = 0
    dm_positions: int = 0
    ngram_positions: int = 0
    topk_mass: list[float] = field(default_factory=list)
    decode_seconds: float = 0.0
    train_seconds: float = 0.0
    publish_seconds: float = 0.0
    head_predicted: list[float] = field(default_factory=list)  # per observed target token (calibration)
    head_observed: list[float] = field(default_factory=list)


class OnlineAdapter:
    def __init__(self, drafter: str | Path, target: str | Path, state: str | Path, cfg: AdaptConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        sched, dist, dec = cfg.schedule, cfg.distill, cfg.decoding
        torch.manual_seed(sched.seed)
        self.drafter_path = Path(drafter)
        self.ident = delta.PairIdentity.of(drafter, target)
        self.dir = delta.pair_dir(state, self.ident)
        self.cache_path = self.dir / "ngram_cache.json"
        # Every answer the pass decodes is remembered: what the deployed decoder copies from (bench +lookup rows).
        self.memory_path = self.dir / "answer_memory.json"
        self.decoder = open_pair(
            Path(target), self.drafter_path, cache_path=self.cache_path, memory_path=self.memory_path
        )
        if self.decoder.drafter.source != "hf":
            raise InvalidArgument(
                f"--drafter {drafter} is an export folder; adaptation trains the HF weights, "
                "pass the drafter's Hugging Face folder (exports are re-lowered from it)"
            )
        base = self.decoder.drafter.backend.model
        self.model = base
        self.resumed = False
        if sched.mode == "lora":
            self.model = wrap_lora(base, sched.rank)
            if (self.dir / "adapter").exists() or (self.dir / "adapter.prev").exists():
                delta.load_adapter(self.model, self.dir / "adapter", self.ident)
                self.resumed = True
        vocab = self.decoder.vocab
        pad = int(self.decoder.drafter.codec.start_ids[0]) if self.decoder.drafter.codec.start_ids else 0
        self.trainer = Trainer(
            self.model,
            vocab.drafter_ids,
            mode=sched.mode,
            loss=dist.loss,
            divergence=dist.divergence,
            engine=sched.engine,
            lr=sched.lr,
            batch_size=sched.every,
            seq_len=sched.seq_len,
            k=min(dist.top_k, vocab.size),
            pad_id=pad,
        )
        self.collector = Collector(
            self.decoder.drafter.codec,
            self.decoder.target.codec,
            vocab,
            k=dist.top_k,
            temperature=dist.temperature,
            splits=dist.splits,
            token_probs=dist.loss == "hybrid-dynamic",
        )
        self.dcfg = DecodeConfig(
            max_new_tokens=dec.max_new_tokens,
            temperature=0.0,
            draft_len=dec.draft_len,
            mode="ngram",
            seed=sched.seed,
            gamma=dec.gamma,
            max_draft_len=dec.max_draft_len,
            splits=dist.splits,
        )
        self.head = self.head_collector = None
        self._last_head = None
        self.gamma_ctl = None
        if dec.tune_gamma and self.dcfg.adaptive:
            from omnidraft.runtime.draft_length.controller import GammaController

            # Drafting stays on here: the drafter and its head learn from the rounds they draft.
            self.gamma_ctl = GammaController(gamma=dec.gamma, k_max=dec.max_draft_len, allow_off=False)
        if cfg.head.train:
            from .head import HeadCollector, HeadTrainer, initial_head

            drf = self.decoder.drafter.backend
            module = initial_head(drf, self.dir / "drafter", self.resumed)
            drf.attach_head(module)
            h = cfg.head
            self.head = HeadTrainer(
                module,
                h.variant,
                lr=h.lr,
                bias_lr=h.bias_lr,
                reject_weight=h.reject_weight,
                steps=h.steps,
                replay=h.replay,
                batch=h.batch,
                temperature=self.dcfg.temperature,
                seed=sched.seed,
                lm_head=base.get_output_embeddings(),
            )
            self.head_collector = HeadCollector(drf, self.dcfg.temperature)
        self.initial = self.trainer.snapshot()
        self.initial_cache = self._cache_copy()
        self.published = self.initial
        self.updates = 0
        self.log = StreamLog()

    def _cache_copy(self):
        import copy

        return copy.deepcopy(self.decoder.cache)

    # -- the stream ---------------------------------------------------------------------------
    def decode(self, prompt: str) -> Record | None:
        self.collector.start(prompt)
        hc, self._last_head = self.head_collector, None
        on_verified = self.collector.on_verified
        if hc is not None:
            hc.start()

            def on_verified(tokens, rows):
                self.collector.on_verified(tokens, rows)
                hc.on_verified(tokens, rows)

        try:
            r = self.decoder.generate(
                prompt, self.dcfg, on_verified=on_verified, trace=hc is not None or self.gamma_ctl is not None
            )
        except ContextOverflow:
            self.log.skipped_prompts += 1
            return None
        finally:
            if hc is not None:
                hc.backend.recorder = None
        if self.gamma_ctl is not None:
            self.gamma_ctl.observe(r)
            self.gamma_ctl.configure(self.dcfg)
        if hc is not None:
            self._last_head = h = hc.finish(r)
            if h is not None:
                self.log.head_predicted.extend(h.predicted.tolist())
                self.log.head_observed.extend(h.observed.tolist())
        return self.collector.finish(r.stats.accepted, r.stats.proposed)

    def run(self, prompts: list[str], on_prompt: Callable[[int, Record | None], None] | None = None) -> StreamLog:
        if not prompts:
            raise InvalidArgument("the stream has no prompts")
        buf: list[Record] = []
        hbuf: list = []  # the acceptance head's records of the same prompts
        window: deque[str] = deque(maxlen=self.cfg.publish.guard_window)
        for i, prompt in enumerate(prompts):
            t0 = time.perf_counter()
            rec = self.decode(prompt)
            self.log.decode_seconds += time.perf_counter() - t0
            if rec is not None:
                self._note(rec)
                buf.append(rec)
                hbuf.append(self._last_head)
                window.append(prompt)
            if on_prompt is not None:
                on_prompt(i, rec)
            if len(buf) == self.cfg.schedule.every:
                self.update(buf, hbuf)
                buf, hbuf = [], []
                if self.updates % self.cfg.publish.every == 0:
                    self.publish(list(window))
            elif self.head is not None:
                t1 = time.perf_counter()
                self.head.after_prompt(self._last_head, i)
                self.log.train_seconds += time.perf_counter() - t1
        if buf:
            self.update(buf, hbuf)
        self.publish(list(window), final=True)
        self.log.events.extend(self.trainer.events)
        return self.log

    def _note(self, rec: Record) -> None:
        lg = self.log
        lg.acceptance.append(rec.acceptance)
        lg.accepted.append(rec.accepted)
        lg.proposed.append(rec.proposed)
        lg.buffer_bytes += rec.nbytes()
        lg.dm_positions += len(rec.dm_rows)
        lg.ngram_positions += len(rec.ng_rows)
        if len(rec.dm_rows):
            lg.topk_mass.append(rec.topk_mass)

    def update(self, records: list[Record], head_records: list | None = None) -> None:
        t0 = time.perf_counter()
        self.updates += 1
        for s in range(self.cfg.schedule.steps_per_update if self.cfg.distill.loss != "none" else 0):
            res = self.trainer.step(records, self.updates)
            self.log.losses.append(
                {
                    "update": self.updates,
                    "step": s,
                    "loss": res.loss,
                    "applied": res.applied,
                    "positions": res.positions,
                    "engine": self.trainer.engine,
                }
            )
            if not res.applied:
                break
        if self.head is not None:
            self.head.on_update(head_records or [], self.updates)
        self.log.train_seconds += time.perf_counter() - t0

    # -- guarded publish ----------------------------------------------------------------------
    def publish(self, window: list[str], final: bool = False) -> bool:
        t0 = time.perf_counter()
        try:
            cand = self.trainer.snapshot()
            changed = any(not torch.equal(cand[n], self.published[n]) for n in cand)
            if changed and window:
                new = measure(self.decoder, window, self.dcfg).acceptance
                self.trainer.restore(self.published)
                old = measure(self.decoder, window, self.dcfg).acceptance
                event = {
                    "event": "guard",
                    "update": self.updates,
                    "window": len(window),
                    "acceptance_new": round(new, 4),
                    "acceptance_previous": round(old, 4),
                }
                margin = self.cfg.publish.guard_margin
                if new < old - margin:
                    event["action"] = "rolled-back"
                    self.trainer.reset_optimizer()
                    self.log.events.append(event)
                    print(
                        f"note: update {self.updates}: window acceptance {new:.3f} < previous {old:.3f} - "
                        f"{margin}; delta rolled back",
                        file=sys.stderr,
                    )
                    if not final:
                        return False
                    cand = self.published  # still write the cache and the (previous) drafter
                else:
                    event["action"] = "published"
                    self.log.events.append(event)
                    self.trainer.restore(cand)
            self._write(cand)
            return True
        finally:
            self.log.publish_seconds += time.perf_counter() - t0

    def _write(self, weights: dict[str, torch.Tensor]) -> None:
        sched = self.cfg.schedule
        info = {"updates": self.updates, "mode": sched.mode, "loss": self.cfg.distill.loss, "rank": sched.rank}
        self.decoder.cache.save(self.cache_path)
        self.decoder.memory.save(self.memory_path)
        if sched.mode == "lora":
            delta.save_adapter(self.model, self.dir / "adapter", self.ident, info)
        extra = None
        if self.head is not None:  # beside the merged weights it was trained on, published with them
            from .head import save_for

            def extra(staging: Path) -> None:
                save_for(self.head, staging, info)

        delta.write_merged(self.model, self.drafter_path, self.dir / "drafter", self.ident, info, extra)
        self.published = weights

    def export(self) -> dict[str, str]:
        """Re-lower the published merged drafter through `omnidraft export` (parity gate included)."""
        out = {}
        pub = self.cfg.publish
        for fmt in pub.export_formats:
            if self.head is not None and fmt == "onnx":  # the head goes inside the graph
                from .head import export_with_head

                path = export_with_head(self.dir / "drafter", self.dir / f"drafter-{fmt}", pub.export_max_seq_len)
                out[fmt] = str(path)
                continue
            path = delta.export_merged(self.dir / "drafter", fmt, self.dir / f"drafter-{fmt}", pub.export_max_seq_len)
            out[fmt] = str(path)
        return out

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate(
        self, prompts: list[str], weights: dict[str, torch.Tensor], cache, progress=None, draft_len: int | None = None
    ) -> Measure:
        """Held-out acceptance of ``weights`` + ``cache`` (a copy is decoded), at the run's K or ``draft_len``."""
        live_w, live_c = self.trainer.snapshot(), self.decoder.cache
        dcfg = self.dcfg if draft_len is None else replace(self.dcfg, draft_len=draft_len)
        try:
            self.trainer.restore(weights)
            self.decoder.cache = cache
            return measure(self.decoder, prompts, dcfg, progress=progress)
        finally:
            self.trainer.restore(live_w)
            self.decoder.cache = live_c

    def config_dict(self) -> dict:
        """The run's options for report.json, flat: the names its `omnidraft adapt` flags use."""
        d = self.cfg.flat()
        d["export_formats"] = list(d["export_formats"])
        return d
