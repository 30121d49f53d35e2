"""Algorithm 2: decode the stream with cross-vocabulary SpD, buffer on-policy data, update the
drafter every I prompts, publish guarded deltas per target.

Publishing (every ``publish_every`` updates and at the end of the stream) runs the drift guard on
the last ``guard_window`` prompts: the candidate weights and the last published weights re-decode
them greedily (same cache copy); a candidate that loses more than ``guard_margin`` acceptance is
rolled back (weights restored, optimizer moments reset) and reported. Otherwise the delta, the
n-gram cache and the merged drafter are written for the target, each atomically.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from omnidraft.errors import ContextOverflow, InvalidArgument
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.session import open_pair

from . import delta
from .buffer import Collector, Record
from .config import AdaptConfig
from .guard import Measure, measure
from .trainer import Trainer, wrap_lora


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
