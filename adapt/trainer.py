"""The drafter being adapted: LoRA (peft layout) or full fine-tuning, AdamW, and the update step.

The model is the very module the speculative loop's drafter backend runs, wrapped in place by peft,
so every update is on-policy for the next prompt. Gradients come from ExecuTorch's training runtime
(LoRA, ``engine="executorch"``) or from torch eager (the reference, full fine-tuning, and the
fallback when the export fails); AdamW is applied in torch either way.
"""

from __future__ import annotations

import logging
import math
import sys
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from omnidraft.errors import ExportError, InvalidArgument

from .buffer import Record
from .loss import Batch, LossModule, make_batch

# lm_head too: on a small drafter the output projection is most of the weights (bundled: 4.1 M of
# 4.5 M), and LoRA on the blocks alone stayed far below full fine-tuning (text, K = 4: 0.107 vs 0.337).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
ENGINES = ("executorch", "eager")
LR = {"lora": 1e-4, "full": 2e-5}
WEIGHT_DECAY = {"lora": 0.0, "full": 0.01}  # paper Table 10 lists 0.01 / 0 without saying which is which

log = logging.getLogger("omnidraft.adapt")


def lora_config(rank: int, alpha: float | None = None):
    from peft import LoraConfig

    if rank < 1:
        raise InvalidArgument(f"--lora-rank must be >= 1 (got {rank})")
    return LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else 2 * rank,
        lora_dropout=0.0,
        target_modules=list(LORA_TARGETS),
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap_lora(model: torch.nn.Module, rank: int, alpha: float | None = None) -> torch.nn.Module:
    """Inject LoRA layers into ``model`` in place (B = 0, so outputs are unchanged); returns the
    PeftModel whose state dict has the PEFT layout. A tied lm_head gets its own copy of the weights
    first: merging W + s*BA into a tied head would also move the input embeddings."""
    from peft import get_peft_model

    from omnidraft.export.quantize import untie_lm_head

    untie_lm_head(model)
    with warnings.catch_warnings():
        # peft reads transformers' deprecated is_gradient_checkpointing; nothing a user can change
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        return get_peft_model(model, lora_config(rank, alpha))


@dataclass
class StepResult:
    loss: float
    applied: bool
    positions: int
    reason: str = ""


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        inter: np.ndarray,
        *,
        mode: str = "lora",
        loss: str = "hybrid",
        divergence: str = "reverse",
        engine: str = "executorch",
        lr: float | None = None,
        batch_size: int = 8,
        seq_len: int = 256,
        k: int = 64,
        pad_id: int = 0,
    ) -> None:
        if engine not in ENGINES:
            raise InvalidArgument(f"unknown --engine {engine!r}; choose one of {', '.join(ENGINES)}")
        if mode == "full" and engine == "executorch":
            engine = "eager"  # the training program carries LoRA parameters only
        self.model, self.mode, self.loss, self.engine = model, mode, loss, engine
        self.batch_size, self.seq_len, self.k, self.pad_id = batch_size, seq_len, k, pad_id
        if mode == "full":
            for p in model.parameters():
                p.requires_grad_(True)
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        if not self.params:
            raise InvalidArgument("the drafter has no trainable parameters; use LoRA or --full-ft")
        self.lr = LR[mode] if lr is None else lr
        self.module = LossModule(model, inter, divergence=divergence)
        self.optimizer = self._new_optimizer()
        self._et = None
        self.events: list[dict] = []
        # True: every batch is padded to seq_len, so one training program serves a whole run (a
        # fleet client lowers it once instead of once per longer batch).
        self.fixed_length = False

    def _new_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            self.params.values(), lr=self.lr, betas=(0.9, 0.999), weight_decay=WEIGHT_DECAY[self.mode]
        )

    def reset_optimizer(self) -> None:
        """After a rollback the moments belong to a discarded trajectory."""
        self.optimizer = self._new_optimizer()

    # -- gradients ---------------------------------------------------------------------------
    def batch(self, records: list[Record]) -> Batch:
        need = min(self.seq_len, max(len(r.ids) for r in records))
        if self.engine != "executorch":
            return make_batch(records, self.loss, self.k, None, need, self.pad_id)
        # The program has one fixed shape: sized to the first batch (rounded up to 32 tokens), and
        # re-exported larger only when a later batch needs more (at most up to seq_len).
        have = self._et.shape[1] if self._et is not None else 0
        length = have if need <= have else min(self.seq_len, -(-need // 32) * 32)
        if self.fixed_length:
            length = self.seq_len
        return make_batch(records, self.loss, self.k, self.batch_size, length, self.pad_id)

    def eager_grads(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        for p in self.params.values():
            p.grad = None
        with torch.enable_grad():
            loss = self.module(*batch.inputs())[0]
            if torch.isfinite(loss):
                loss.backward()
        grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in self.params.items()}
        return loss.detach(), grads

    def et_grads(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self._et is None or self._et.shape != tuple(batch.ids.shape):
            from .etprogram import ExecuTorchStep

            self._et = ExecuTorchStep(self.module, batch)
            self.events.append(
                {
                    "event": "training-program",
                    "shape": list(batch.ids.shape),
                    "bytes": len(self._et.program),
                    "reused": self._et.reused,
                }
            )
        return self._et(batch)

    def grads(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self.engine == "executorch":
            try:
                return self.et_grads(batch)
            except ExportError as exc:
                print(f"note: {exc}; falling back to eager gradients", file=sys.stderr)
                self.events.append({"event": "engine-fallback", "reason": str(exc)})
                self.engine = "eager"  # the fixed-shape batch is a valid eager batch too
        return self.eager_grads(batch)

    # -- the update --------------------------------------------------------------------------
    def step(self, records: list[Record], update: int = 0) -> StepResult:
        """One AdamW step on ``records``; a non-finite loss or gradient leaves the weights as they were."""
        batch = self.batch(records)
        if batch.positions == 0:
            return StepResult(0.0, False, 0, "no loss positions")
        loss, grads = self.grads(batch)
        value = float(loss)
        bad = not math.isfinite(value) or any(not torch.isfinite(g).all() for g in grads.values())
        if bad:
            msg = f"update {update}: non-finite loss/gradient ({value}); update skipped, weights kept"
            log.warning(msg)
            print(f"warning: {msg}", file=sys.stderr)
            self.events.append({"event": "skipped-update", "update": update, "loss": str(value)})
            for p in self.params.values():
                p.grad = None
            return StepResult(value, False, batch.positions, "non-finite")
        for n, p in self.params.items():
            p.grad = grads[n].to(p.dtype).reshape(p.shape)
        self.optimizer.step()
        for p in self.params.values():
            p.grad = None
        return StepResult(value, True, batch.positions)

    # -- snapshots (drift guard) --------------------------------------------------------------
    def snapshot(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.params.items()}

    def restore(self, snap: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(snap[n])
