"""The one small protocol every model backend implements.

A backend owns a KV cache holding the first ``cached_len`` positions of a sequence. The loop
feeds tokens at explicit positions and rolls the cache back after a rejection; it never knows
which engine (torch eager, ONNX Runtime, ExecuTorch) sits behind it.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class Backend(Protocol):
    name: str            # e.g. "torch", "ort", "executorch"
    vocab_size: int      # width of the logits rows
    max_seq_len: int     # positions the KV cache can hold

    @property
    def cached_len(self) -> int:
        """Number of positions currently held in the KV cache."""

    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        """Run ``token_ids`` at positions ``start_pos .. start_pos+len-1``.

        ``start_pos`` must equal ``cached_len``. Returns float32 logits of shape
        ``(len(token_ids), vocab_size)``; afterwards ``cached_len == start_pos + len``.
        """

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` cached positions (``length <= cached_len``)."""

    def reset(self) -> None:
        """Drop the whole cache (start a new sequence)."""


# Optional capability (adaptive drafting, issue #6). A drafter backend that carries an acceptance
# head sets ``has_accept_head = True`` and implements
#     forward_with_accept(token_ids, start_pos) -> (logits [len, vocab], accept_logits [len])
# with the same cache semantics as ``forward``; accept_logits[r] is the head's logit that the token
# drafted from logits row r is accepted, before that token is known; and
#     accept_bias(token) -> float
# the head's per-drafted-token bias, which the loop adds once it has chosen the token (the graph
# cannot know a sampled token). Backends without a head need not define any of these.

def has_accept_head(backend: object) -> bool:
    return bool(getattr(backend, "has_accept_head", False))


def check_forward_args(backend: Backend, token_ids: Sequence[int], start_pos: int) -> None:
    """Shared argument checks; backends call this first so misuse fails the same way everywhere."""
    if start_pos != backend.cached_len:
        raise ValueError(f"{backend.name}: forward at position {start_pos} but cache holds {backend.cached_len}")
    if len(token_ids) == 0:
        raise ValueError(f"{backend.name}: forward with no tokens")
    if start_pos + len(token_ids) > backend.max_seq_len:
        raise ValueError(
            f"{backend.name}: positions up to {start_pos + len(token_ids)} exceed the cache of {backend.max_seq_len}")
