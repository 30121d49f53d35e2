"""One process's view of the pair: the on-device online pass a client runs each round, and the
measurements the server makes (held-out acceptance, probe agreement, the exact merged mean).

It wraps ``omnidraft.adapt.online.OnlineAdapter`` (hybrid loss, LoRA gradients from the ExecuTorch
training program, drift guard), loaded once per process and reset to the round's global adapter
before every pass: a Flower client process serves many rounds, and the training program is lowered
once for the base weights it bakes in.
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from omnidraft.adapt import delta
from omnidraft.adapt.buffer import Record
from omnidraft.adapt.config import AdaptConfig, PublishPolicy, StreamDecoding, UpdateSchedule
from omnidraft.adapt.guard import Measure, measure
from omnidraft.adapt.online import OnlineAdapter, StreamLog
from omnidraft.runtime.decode_config import DecodeConfig

from .aggregate import Adapter
from .config import LocalConfig


@dataclass
class LocalResult:
    adapter: Adapter
    verified_tokens: int  # target tokens of the responses the pass learned from (FedAvg's weight)
    live_acceptance: float  # acceptance while decoding the pass, before its update
    rolled_back: bool
    updates: int


class Learner:
    def __init__(self, *, drafter: Path, target: Path, local: LocalConfig, seed: int = 0) -> None:
        self.drafter, self.target = Path(drafter), Path(target)
        self.cfg = AdaptConfig(
            schedule=UpdateSchedule(
                rank=local.rank,
                every=local.prompts_per_round,
                steps_per_update=local.local_steps,
                lr=local.lr,
                engine=local.engine,
                seq_len=local.seq_len,
                seed=seed,
            ),
            decoding=StreamDecoding(max_new_tokens=local.max_new_tokens, draft_len=local.draft_len),
            publish=PublishPolicy(
                every=1_000_000,  # one guarded publish, at the end of the round's pass
                guard_window=local.guard_window,
                guard_margin=local.guard_margin,
            ),
        )
        # The adapter's own state folder is scratch: what counts leaves in the reply message.
        self._scratch = tempfile.TemporaryDirectory(prefix="omnidraft-fleet-")
        self.ad = OnlineAdapter(self.drafter, self.target, self._scratch.name, self.cfg)
        self.ad.trainer.fixed_length = True  # one program shape for every round of this process
        self.ident = self.ad.ident
        self.empty_cache = copy.deepcopy(self.ad.decoder.cache)
        self.initial = self.adapter()  # seeded A, B = 0: the untrained drafter, round 0's global adapter

    # -- adapters ----------------------------------------------------------------------------
    def adapter(self) -> Adapter:
        from peft import get_peft_model_state_dict

        sd = get_peft_model_state_dict(self.ad.model, save_embedding_layers=False)
        return {k: v.detach().clone().contiguous() for k, v in sd.items()}

    def set_adapter(self, adapter: Adapter) -> None:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.ad.model, adapter)

    # -- the device's round --------------------------------------------------------------------
    def train(self, global_adapter: Adapter, prompts: list[str], *, poisoned: bool = False) -> LocalResult:
        ad = self.ad
        self.set_adapter(global_adapter)
        ad.trainer.reset_optimizer()  # moments of the previous round belong to another starting point
        ad.initial = ad.published = ad.trainer.snapshot()
        ad.updates, ad.log = 0, StreamLog()
        ad.decoder.cache = copy.deepcopy(self.empty_cache)
        seen: list[Record] = []
        with self._poisoned(seed=len(prompts)) if poisoned else contextlib.nullcontext():
            log = ad.run(prompts, lambda i, rec: seen.append(rec) if rec is not None else None)
        rolled = any(e.get("action") == "rolled-back" for e in log.events if e.get("event") == "guard")
        return LocalResult(
            adapter=self.adapter(),
            verified_tokens=sum(r.target_tokens for r in seen),
            live_acceptance=sum(log.accepted) / max(1, sum(log.proposed)),
            rolled_back=rolled,
            updates=ad.updates,
        )

    @contextlib.contextmanager
    def _poisoned(self, *, seed: int) -> Iterator[None]:
        """A poisoned device: every distillation target is a random intersection token and its own
        drift guard is off (an attacker would not run it)."""
        ad, rng = self.ad, np.random.default_rng(seed)
        decode, margin = ad.decode, ad.cfg.publish.guard_margin
        size = ad.decoder.vocab.size

        def random_targets(prompt: str) -> Record | None:
            rec = decode(prompt)
            if rec is not None:
                rec.dm_idx = rng.integers(0, size, rec.dm_idx.shape).astype(rec.dm_idx.dtype)
                rec.ng_rows = rec.ng_rows[:0]
                if rec.ng_split is not None:
                    rec.ng_split = rec.ng_split[:0]
                if rec.ng_prob is not None:
                    rec.ng_prob = rec.ng_prob[:0]
            return rec

        ad.decode, ad.cfg.publish.guard_margin = random_targets, float("inf")
        try:
            yield
        finally:
            ad.decode, ad.cfg.publish.guard_margin = decode, margin

    # -- measurements --------------------------------------------------------------------------
    def acceptance(self, adapter: Adapter, prompts: list[str], *, mode: str = "ngram") -> Measure:
        """Greedy held-out acceptance of ``adapter`` from an empty n-gram cache (weights compared alone)."""
        self.set_adapter(adapter)
        dec = self.ad.decoder
        live = dec.cache
        dec.cache = copy.deepcopy(self.empty_cache)
        try:
            cfg = DecodeConfig(
                max_new_tokens=self.cfg.decoding.max_new_tokens,
                temperature=0.0,
                draft_len=self.cfg.decoding.draft_len,
                mode=mode,
            )
            return measure(dec, prompts, cfg)
        finally:
            dec.cache = live

    def probe_records(self, adapter: Adapter, prompts: list[str]) -> list[Record]:
        """The target's distributions on responses decoded with ``adapter`` (the server's probe set)."""
        self.set_adapter(adapter)
        live = self.ad.decoder.cache
        self.ad.decoder.cache = copy.deepcopy(self.empty_cache)
        try:
            return [r for r in (self.ad.decode(p) for p in prompts) if r is not None and len(r.dm_rows)]
        finally:
            self.ad.decoder.cache = live

    @torch.no_grad()
    def agreement(self, adapter: Adapter | None, records: list[Record]) -> float:
        """Teacher-forced greedy agreement on the probe positions: the drafter's top intersection
        token equals the target's top one. One drafter forward per record, no decoding."""
        if adapter is not None:
            self.set_adapter(adapter)
        inter = torch.from_numpy(self.ad.decoder.vocab.drafter_ids.astype(np.int64))
        hit = total = 0
        for r in records:
            ids = torch.from_numpy(r.ids.astype(np.int64))[None]
            logits = self.ad.model(input_ids=ids).logits[0]
            rows = torch.from_numpy(r.dm_rows.astype(np.int64))
            mine = logits[rows][:, inter].argmax(-1)
            theirs = torch.from_numpy(r.dm_idx.astype(np.int64)).gather(
                1, torch.from_numpy(r.dm_logp.astype(np.float32)).argmax(-1, keepdim=True)
            )[:, 0]
            hit += int((mine == theirs).sum())
            total += len(rows)
        return hit / total if total else 0.0

    @contextlib.contextmanager
    def dense_update(self, adapters: list[Adapter], weights: list[float]) -> Iterator[None]:
        """The base weights moved by the exact weighted mean of the layer updates, sum_i w_i s B_i A_i,
        with the LoRA factors zeroed (what averaging merged deltas would ship)."""
        model = self.ad.model
        total = float(sum(weights)) or float(len(adapters))
        saved = []
        with torch.no_grad():
            for name in adapters[0]:
                if "lora_A" not in name:
                    continue
                module = model.get_submodule(name.rsplit(".lora_A", 1)[0])
                b_name = name.replace("lora_A", "lora_B")
                upd = sum(x[b_name].double() @ x[name].double() * (w / total) for x, w in zip(adapters, weights))
                base = module.base_layer.weight
                lb = module.lora_B["default"].weight
                saved.append((base, base.detach().clone(), lb, lb.detach().clone()))
                base.add_((module.scaling["default"] * upd).to(base.dtype))
                lb.zero_()
        try:
            yield
        finally:
            with torch.no_grad():
                for base, b0, lb, lb0 in saved:
                    base.copy_(b0)
                    lb.copy_(lb0)

    # -- publishing ----------------------------------------------------------------------------
    def write_drafter(self, adapter: Adapter, folder: Path, info: dict) -> Path:
        """The global drafter with W + s*BA folded in, as an HF folder (swapped in atomically)."""
        self.set_adapter(adapter)
        return delta.write_merged(self.ad.model, self.drafter, folder, self.ident, info)

    def close(self) -> None:
        self._scratch.cleanup()
