"""Reference backend: a local Hugging Face folder run in eager PyTorch with a DynamicCache."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.utils import logging as hf_logging

from omnidraft.errors import ModelFolderError
from omnidraft.runtime.backends.base import check_forward_args
from omnidraft.runtime.draft_length.head_model import forward_with_head


def _full_cache() -> DynamicCache:
    """A cache that keeps every position in every layer. Sliding-window layers (Gemma 3) then still
    attend only within their window, through the mask, but a rollback can crop any of them: a
    window-sized cache cannot give back positions it has dropped."""
    return DynamicCache()


class TorchEagerBackend:
    name = "torch"

    def __init__(self, folder: Path, max_seq_len: int | None = None, dtype: torch.dtype = torch.float32) -> None:
        hf_logging.disable_progress_bar()
        try:
            self.model = AutoModelForCausalLM.from_pretrained(
                folder, dtype=dtype, local_files_only=True, use_safetensors=True
            )
        except (OSError, ValueError, KeyError) as exc:
            raise ModelFolderError(
                f"cannot load the model in {folder}: {exc}".splitlines()[0]
                + "; check config.json and model.safetensors"
            ) from None
        self.model.eval()
        cfg = self.model.config
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        limit = int(getattr(cfg, "max_position_embeddings", 2048))
        self.max_seq_len = min(max_seq_len or limit, limit)
        self._cache = _full_cache()
        self._len = 0
        self.head = None  # AcceptHead, attached by the loader when the drafter has one
        # Online head training (omnidraft.adapt.head) sets a list here: every call then appends the
        # final normed hidden state of its last row, the features of the token drafted from it.
        self.recorder: list[torch.Tensor] | None = None

    @property
    def has_accept_head(self) -> bool:
        return self.head is not None

    def attach_head(self, head) -> None:
        self.head = head.eval() if head is not None else None

    @property
    def cached_len(self) -> int:
        return self._len

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        check_forward_args(self, token_ids, start_pos)
        ids = torch.tensor([list(token_ids)], dtype=torch.long)
        pos = torch.arange(start_pos, start_pos + ids.shape[1]).unsqueeze(0)
        rec = self.recorder is not None
        out = self.model(
            input_ids=ids, position_ids=pos, past_key_values=self._cache, use_cache=True, output_hidden_states=rec
        )
        self._len = start_pos + ids.shape[1]
        if rec:
            self.recorder.append(out.hidden_states[-1][0, -1].float().clone())
        return out.logits[0].float().numpy()

    @torch.inference_mode()
    def forward_with_accept(self, token_ids: Sequence[int], start_pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Logits and the acceptance head's logits (see base.py), from one drafter call."""
        if self.head is None:
            raise ValueError("torch: this drafter has no acceptance head")
        check_forward_args(self, token_ids, start_pos)
        ids = torch.tensor([list(token_ids)], dtype=torch.long)
        pos = torch.arange(start_pos, start_pos + ids.shape[1]).unsqueeze(0)
        out, accept = forward_with_head(
            self.model, self.head, input_ids=ids, position_ids=pos, past_key_values=self._cache, use_cache=True
        )
        self._len = start_pos + ids.shape[1]
        if self.recorder is not None:
            self.recorder.append(out.hidden_states[-1][0, -1].float().clone())
        return out.logits[0].float().numpy(), accept[0].float().numpy().astype(np.float32, copy=False)

    def accept_bias(self, token: int) -> float:
        return self.head.bias_of(token) if self.head is not None else 0.0

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"rollback to {length} but the cache holds {self._len}")
        if length < self._len:
            self._cache.crop(length - self._len)  # transformers 5: a negative count of tokens to drop
            self._len = length

    def reset(self) -> None:
        self._cache = _full_cache()
        self._len = 0
