"""The one small protocol every model backend implements.

A backend owns a KV cache holding the first ``cached_len`` positions of a sequence. The loop
feeds tokens at explicit positions and rolls the cache back after a rejection; it never knows
which engine (torch eager, ONNX Runtime, ExecuTorch) sits behind it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from omnidraft.errors import ManifestError


@runtime_checkable
class Backend(Protocol):
    name: str  # e.g. "torch", "ort", "executorch"
    vocab_size: int  # width of the logits rows
    max_seq_len: int  # positions the KV cache can hold

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


# Optional capability: an acceptance head (``runtime.draft_length.policy.AcceptHeadBackend``).
# Backends without a head need not define any of its methods.
#
# Optional too: ``forward_last`` / ``forward_with_accept_last``, the same calls returning only the
# last position's logits row (and acceptance logit), which is all a drafting step reads. A backend
# that widens a trimmed drafter's rows (Widen below) then widens one row: on a prompt's prefill
# widening the other rows would dominate the drafter's call. The loop goes through ``last_row`` / ``last_row_accept``.


def last_row(backend: Backend, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
    fn = getattr(backend, "forward_last", None)
    return fn(token_ids, start_pos) if fn is not None else backend.forward(token_ids, start_pos)[-1]


def last_row_accept(backend: Backend, token_ids: Sequence[int], start_pos: int) -> tuple[np.ndarray, float]:
    fn = getattr(backend, "forward_with_accept_last", None)
    if fn is not None:
        return fn(token_ids, start_pos)
    rows, z = backend.forward_with_accept(token_ids, start_pos)
    return rows[-1], float(z[-1])


# Optional as well: ``prefill``, the forward call whose logits nobody reads (a prompt's pass): a backend
# may skip the LM head there, which on a large vocabulary is most of that pass. The loop goes through
# ``fill``.


def fill(backend: Backend, token_ids: Sequence[int], start_pos: int) -> None:
    fn = getattr(backend, "prefill", None)
    if fn is not None:
        fn(token_ids, start_pos)
    else:
        backend.forward(token_ids, start_pos)


# Intra-op threads of a drafter's ONNX Runtime session. A small drafter's step is a few hundred tiny
# kernels, so a second thread only adds pool wake-ups and makes each step slower, alone and inside
# the loop between target calls (docs/decisions.md). The target keeps every core.
DRAFTER_THREADS = 1


def check_forward_args(backend: Backend, token_ids: Sequence[int], start_pos: int) -> None:
    """Shared argument checks; backends call this first so misuse fails the same way everywhere."""
    if start_pos != backend.cached_len:
        raise ValueError(f"{backend.name}: forward at position {start_pos} but cache holds {backend.cached_len}")
    if len(token_ids) == 0:
        raise ValueError(f"{backend.name}: forward with no tokens")
    if start_pos + len(token_ids) > backend.max_seq_len:
        raise ValueError(
            f"{backend.name}: positions up to {start_pos + len(token_ids)} exceed the cache of {backend.max_seq_len}"
        )


# A drafter exported with --draft-vocab N (export/draft_vocab.py) scores its N kept tokens only; its
# backend widens each row to the full vocabulary with the others at NEG_LOGIT, so the loop sees one
# row width everywhere. Finite, so parity differences stay 0 where both sides drop a token, and low
# enough that softmax gives exactly 0 even at temperature 0.01. Widening is done here in numpy, not as
# an ONNX Gather in the graph: ONNX Runtime's scatter is an order of magnitude slower, a large share of
# a small drafter's step.
NEG_LOGIT = -1e9


class Widen:
    """Rows over the manifest's kept token ids -> full-width rows."""

    def __init__(self, draft_vocab: dict, vocab_size: int, where: str) -> None:
        kept = np.asarray(draft_vocab.get("kept", ()), dtype=np.int64)
        if (
            kept.ndim != 1
            or len(kept) != draft_vocab.get("size")
            or not len(kept)
            or kept[0] < 0
            or kept[-1] >= vocab_size
            or (np.diff(kept) <= 0).any()
        ):
            raise ManifestError(
                f"{where} has a malformed draft_vocab (kept ids must be {draft_vocab.get('size')} "
                f"increasing ids below {vocab_size}); re-export the drafter"
            )
        self.kept, self.vocab_size = kept, vocab_size

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        if rows.shape[-1] != len(self.kept):
            raise ManifestError(
                f"the drafter returned rows of {rows.shape[-1]} logits, its manifest keeps "
                f"{len(self.kept)} tokens; re-export the drafter"
            )
        out = np.full((*rows.shape[:-1], self.vocab_size), NEG_LOGIT, dtype=np.float32)
        out[..., self.kept] = rows
        return out


def widen_for(manifest, where: str) -> Widen | None:
    return Widen(manifest.draft_vocab, manifest.vocab_size, where) if manifest.draft_vocab else None
