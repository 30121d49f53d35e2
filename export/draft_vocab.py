"""A drafter's output layer cut to its N most frequent tokens (FR-Spec's frequency-ranked head).

A small drafter's step is dominated by its LM head: the bundled drafter's 32,000 x 128 int8 head
took 0.25 of a 0.41 ms ONNX Runtime step (1 thread), the two transformer layers the rest; with
4,096 rows the step took 0.18 ms. Only the drafter's speed changes: the target verifies every
proposal, so greedy output stays target-only's, and a sampled draft comes from the trimmed
distribution, which is the q the acceptance rule divides by.

The artifact's ``logits`` are ``[1,k,N]``; the manifest's ``draft_vocab.kept`` lists the N ids and
the runtime backend widens each row to the full vocabulary (runtime/backends/base.py: Widen), so
the loop never sees the difference. In eager PyTorch (the parity references) the head widens
itself the same way. The ranking comes from token counts: ``token_counts.json`` in the model folder
(written by ``omnidraft.models.train`` from its training rows) or a text corpus tokenized with the
drafter's own tokenizer.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from omnidraft.errors import InvalidArgument, ModelFolderError
from omnidraft.runtime.backends.base import NEG_LOGIT
from omnidraft.runtime.manifest import sha256_file

from .recipes import COUNTS_FILE

MIN_SIZE = 64


@dataclass(frozen=True)
class DraftVocab:
    kept: np.ndarray  # sorted token ids that keep their logits
    vocab_size: int
    source: str  # where the counts came from
    coverage: float  # share of the counted token occurrences that are kept

    def manifest_entry(self) -> dict:
        return {
            "size": int(len(self.kept)),
            "of": self.vocab_size,
            "source": self.source,
            "coverage": round(self.coverage, 5),
            "kept": [int(i) for i in self.kept],
        }


def write_counts(folder: Path, counts: np.ndarray, tokenizer_file: Path, source: str) -> None:
    from omnidraft.atomic import write_json

    write_json(
        folder / COUNTS_FILE,
        {
            "tokenizer_sha256": sha256_file(tokenizer_file),
            "source": source,
            "tokens": int(counts.sum()),
            "counts": [int(c) for c in counts],
        },
    )


def read_counts(folder: Path, vocab_size: int) -> np.ndarray:
    """Counts from ``folder/token_counts.json``; it must belong to the folder's tokenizer."""
    path = folder / COUNTS_FILE
    try:
        data = json.loads(path.read_text())
        counts = np.asarray(data["counts"], dtype=np.int64)
        tok_sha = data["tokenizer_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelFolderError(
            f"{path} is unreadable or malformed ({str(exc)[:120]}); rebuild it with "
            "`python -m omnidraft.models.train --recipe drafter --export-only` or pass "
            "--vocab-corpus FILE"
        ) from None
    if counts.shape != (vocab_size,) or (counts < 0).any():
        raise ModelFolderError(
            f"{path} holds {counts.size} counts for a vocabulary of {vocab_size}; it belongs to "
            "another model: pass --vocab-corpus FILE"
        )
    if tok_sha != sha256_file(folder / "tokenizer.json"):
        raise ModelFolderError(
            f"{path} was counted with another tokenizer than {folder / 'tokenizer.json'}; "
            "pass --vocab-corpus FILE to count with this one"
        )
    return counts


def count_corpus(corpus: Path, tokenizer_file: Path, vocab_size: int) -> np.ndarray:
    """Token counts of a UTF-8 text file under the drafter's tokenizer."""
    from tokenizers import Tokenizer

    try:
        text = Path(corpus).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidArgument(f"--vocab-corpus {corpus} does not exist; pass a UTF-8 text file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"--vocab-corpus {corpus} cannot be read as UTF-8 text ({str(exc)[:80]})") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise InvalidArgument(f"--vocab-corpus {corpus} holds no text; pass a file of the drafter's kind of text")
    ids = [i for enc in Tokenizer.from_file(str(tokenizer_file)).encode_batch(lines) for i in enc.ids]
    return np.bincount(np.asarray(ids, dtype=np.int64), minlength=vocab_size)[:vocab_size]


def choose(folder: Path, size: int, vocab_size: int, always: list[int], corpus: Path | None = None) -> DraftVocab:
    """The ``size`` most counted tokens (ties by id), ``always`` (special tokens) among them."""
    if not MIN_SIZE <= size < vocab_size:
        raise InvalidArgument(
            f"--draft-vocab must be within [{MIN_SIZE}, {vocab_size - 1}] for this "
            f"{vocab_size}-token drafter (got {size}); omit it to keep every token"
        )
    if corpus is not None:
        counts, source = count_corpus(corpus, folder / "tokenizer.json", vocab_size), f"corpus {Path(corpus).name}"
    elif (folder / COUNTS_FILE).is_file():
        counts, source = read_counts(folder, vocab_size), COUNTS_FILE
    else:
        raise InvalidArgument(
            f"--draft-vocab ranks tokens by frequency, and {folder} has no {COUNTS_FILE}; "
            "pass --vocab-corpus FILE (text like the drafter's) to count them"
        )
    ids = np.arange(vocab_size)
    order = np.lexsort((ids, -counts))
    special = [i for i in dict.fromkeys(always) if 0 <= i < vocab_size]
    rest = order[~np.isin(order, special)][: size - len(special)]
    kept = np.sort(np.concatenate([np.asarray(special, dtype=np.int64), rest]))
    total = counts.sum()
    coverage = float(counts[kept].sum() / total) if total else 1.0
    return DraftVocab(kept, vocab_size, source, coverage)


def special_ids(folder: Path, bos: int | None, eos) -> list[int]:
    """BOS, EOS and the tokenizer's special tokens: the loop needs them whatever their counts."""
    out = [
        i for i in ([bos] if bos is not None else []) + (eos if isinstance(eos, list) else [eos]) if isinstance(i, int)
    ]
    try:
        added = json.loads((folder / "tokenizer.json").read_text()).get("added_tokens") or []
        out += [int(t["id"]) for t in added if t.get("special")]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # the tokenizer is validated where it is loaded; here it only adds ids
    return out


class TrimmedHead(torch.nn.Module):
    """``Linear(hidden, N)`` over the kept rows. Eager, it widens to the full vocabulary (one
    index_select) as the runtime does; inside ``small_logits`` it returns the N columns."""

    def __init__(self, weight: torch.Tensor, vocab: DraftVocab) -> None:
        super().__init__()
        kept = torch.as_tensor(vocab.kept, dtype=torch.long)
        self.proj = torch.nn.Linear(weight.shape[1], len(kept), bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(weight.detach()[kept])
        # Column of each vocabulary id in [small logits | NEG_LOGIT]; dropped ids read the last one.
        index = torch.full((vocab.vocab_size,), len(kept), dtype=torch.long)
        index[kept] = torch.arange(len(kept))
        self.register_buffer("index", index, persistent=False)
        self.widen = True

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        small = self.proj(hidden)
        if not self.widen:
            return small
        return torch.nn.functional.pad(small, (0, 1), value=NEG_LOGIT).index_select(-1, self.index)


@contextmanager
def small_logits(model: torch.nn.Module):
    """Trace/export with every TrimmedHead returning its N columns (the artifact's logits)."""
    heads = [m for m in model.modules() if isinstance(m, TrimmedHead)]
    for h in heads:
        h.widen = False
    try:
        yield
    finally:
        for h in heads:
            h.widen = True


def trim_head(module: torch.nn.Module, attr: str, vocab: DraftVocab) -> None:
    """Replace ``module.<attr>`` (a bias-free Linear over the vocabulary) by its TrimmedHead."""
    head = getattr(module, attr)
    if not isinstance(head, torch.nn.Linear) or head.bias is not None or head.out_features != vocab.vocab_size:
        raise InvalidArgument(
            f"--draft-vocab needs a bias-free {vocab.vocab_size}-way output Linear, and this "
            f"model's {attr} is {type(head).__name__}; export it without --draft-vocab"
        )
    setattr(module, attr, TrimmedHead(head.weight, vocab))
    if getattr(getattr(module, "config", None), "tie_word_embeddings", False):
        module.config.tie_word_embeddings = False  # the head holds its own rows now
