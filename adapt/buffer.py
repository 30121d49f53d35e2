"""On-policy buffer: what the hybrid loss needs, taken from the verification passes of the loop.

For each decoded (prompt, response) a ``Record`` keeps

* ``ids``: the drafter's token context at the end of the response (start ids + prompt + response),
  rebuilt exactly as the loop rebuilds it (``DrafterContext`` fed the same bytes per round);
* directly-mapped (DM) positions: target tokens spelled by exactly one drafter token that maps to them.
  At each, the target's distribution restricted to the vocabulary intersection and renormalised, kept
  as the top-K intersection entries (log-probabilities, float16) plus the per-token log-probability
  of the remaining tail (float32). With K = 64 this costs 64*(2+2)+4 bytes per position instead of
  4*|intersection| (~71 KB for 17,830 ids). float16 log-probabilities have a relative error of
  2^-11, i.e. a probability error under 1% down to p = e^-20, and no underflow, unlike float16
  probabilities that go subnormal below 6e-5. The reverse KL is mode-seeking: it is driven by where
  the drafter puts mass, and a drafter that puts mass on the tail is charged log(tail/n) per token,
  which is what the full distribution would charge on average;
* n-gram positions: drafter sub-tokens of target tokens spelled by >= 2 drafter tokens with matching
  byte boundaries, the labels of the paper's NLL term. A target token spelled by one drafter token
  without a direct mapping (byte-fallback "\\n") is not an n-gram and gets no label: with it in the
  NLL term, text acceptance after one pass fell well below DM-only training, a larger loss than
  math (whose lines always end in one) suffers without them;
* split positions (our extension, with ``splits``): a drafter token without a direct mapping whose
  bytes are exactly several consecutive target tokens (e.g. a run of spaces the target writes one
  space at a time). The loop proposes it as a split (greedy); its label joins the NLL term, the
  point-wise likelihood of a multi-token span the target produced, mirroring the n-gram case, with
  its own weight (``ng_split``; loss.SPLIT_LAMBDA).

Row ``r`` of the drafter's logits predicts ``ids[r + 1]``; positions below are rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from omnidraft.runtime.tokenizer import TokenCodec
from omnidraft.runtime.translate import DrafterContext
from omnidraft.runtime.vocab import VocabMap

TOP_K = 64
LOGP_FLOOR = -50.0  # a probability that underflowed to 0 would make the KL infinite


@dataclass
class Record:
    prompt: str
    ids: np.ndarray  # int32 [n] drafter context
    dm_rows: np.ndarray  # int32 [n_dm] logits rows predicting a DM token
    dm_idx: np.ndarray  # uint16/int32 [n_dm, K] intersection indices (into VocabMap.drafter_ids)
    dm_logp: np.ndarray  # float16 [n_dm, K] log p over the intersection
    dm_tail: np.ndarray  # float32 [n_dm] log p of each intersection id outside the top K
    ng_rows: np.ndarray  # int32 [n_ng] logits rows predicting an n-gram sub-token
    ng_prob: np.ndarray | None = None  # float32 [n_ng] target p(t) (T = 1) of each row's token; token_probs only
    ng_split: np.ndarray | None = None  # bool [n_ng] the row's label is a split drafter token (our extension)
    accepted: int = 0
    proposed: int = 0
    topk_mass: float = 0.0  # mean share of the intersection mass the top K hold (for the report)
    target_tokens: int = 0
    stats: dict = field(default_factory=dict)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def nbytes(self) -> int:
        arrays = (
            self.ids,
            self.dm_rows,
            self.dm_idx,
            self.dm_logp,
            self.dm_tail,
            self.ng_rows,
            self.ng_prob,
            self.ng_split,
        )
        return sum(a.nbytes for a in arrays if a is not None)


def compact_target(
    logits: np.ndarray, vocab: VocabMap, k: int = TOP_K, temperature: float = 1.0
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Target logits row -> (top-k intersection indices, their log p (renormalised over the
    intersection), tail log p per remaining id, top-k mass). ``temperature`` < 1 sharpens p towards
    the distribution that greedy/low-temperature verification actually accepts from."""
    z = logits.astype(np.float64) / temperature
    z = z - z.max()
    p = np.exp(z)
    p_i = p[vocab.target_ids]
    p_i /= p_i.sum()
    n = p_i.size
    k = min(k, n)
    top = np.argpartition(-p_i, k - 1)[:k] if k < n else np.arange(n)
    top = top[np.argsort(-p_i[top], kind="stable")]
    mass = float(p_i[top].sum())
    logp = np.maximum(np.log(np.maximum(p_i[top], 1e-300)), LOGP_FLOOR)
    tail = max(float(np.log(max(1.0 - mass, 1e-300) / (n - k))), LOGP_FLOOR) if n > k else 0.0
    return top, logp, tail, mass


def token_prob(logits: np.ndarray, token: int) -> float:
    """The target's own probability (temperature 1) of the token it verified: the paper's dynamic lambda."""
    z = logits.astype(np.float64)
    z = z - z.max()
    return float(np.exp(z[token]) / np.exp(z).sum())


class Collector:
    """Builds one Record per generation; pass ``on_verified`` to ``SpeculativeDecoder.generate``."""

    def __init__(
        self,
        drafter_codec: TokenCodec,
        target_codec: TokenCodec,
        vocab: VocabMap,
        lookbehind: int = 8,
        k: int = TOP_K,
        temperature: float = 1.0,
        splits: bool = True,
        token_probs: bool = False,
    ) -> None:
        self.dc, self.tc, self.vocab, self.lookbehind = drafter_codec, target_codec, vocab, lookbehind
        self.splits = splits
        # p(t) costs one more softmax over the target vocabulary per verified token, a tenth of a
        # target step; only the dynamic-lambda loss reads it.
        self.token_probs = token_probs
        self.temperature = temperature
        self.k = min(k, vocab.size)
        self.idx_dtype = np.uint16 if vocab.size <= 65535 else np.int32

    def start(self, prompt: str) -> None:
        self.prompt = prompt
        self.dctx = DrafterContext(self.dc, prompt, self.lookbehind)
        self.pos = len(self.dctx.text)
        self.spans: list[tuple[int, int, int]] = []  # target (id, start, end) byte spans
        self.rows: list[tuple[np.ndarray, np.ndarray, float, float]] = []
        self.probs: list[float] = []  # the target's own p(t) of each verified token (dynamic lambda)

    def on_verified(self, tokens: list[int], logits: np.ndarray) -> None:
        # Mirror the loop's reverse translation round by round so the drafter context is the same.
        spelled = [self.tc.spell([t]) for t in tokens]
        for t, b, row in zip(tokens, spelled, logits):
            self.spans.append((t, self.pos, self.pos + len(b)))
            self.pos += len(b)
            self.rows.append(compact_target(row, self.vocab, self.k, self.temperature))
            self.probs.append(token_prob(row, t) if self.token_probs else 0.0)
        self.dctx.append(b"".join(spelled))

    def finish(self, accepted: int = 0, proposed: int = 0) -> Record:
        d = self.dctx
        toks, starts = d.tokens, d.starts
        ends = starts[1:] + [d.valid_end]
        offset = len(d.prefix)
        by_start = {s: n for n, s in enumerate(starts)}
        dm_rows, dm_idx, dm_logp, dm_tail, ng_rows, ng_prob, ng_split, masses = [], [], [], [], [], [], [], []
        target_ends = {b for _, _, b in self.spans}
        for (t, a, b), (top, logp, tail, mass), p_t in zip(self.spans, self.rows, self.probs):
            n = by_start.get(a)
            if n is None or a == b:
                continue  # boundary inside a drafter token, or a special token with no bytes
            m = n
            while m < len(toks) and ends[m] < b:
                m += 1
            if m >= len(toks):
                continue
            if ends[m] != b:
                if self.splits and m == n and ends[n] in target_ends and toks[n] in self.vocab.splits:
                    ng_rows.append(offset + n - 1)  # t opens a split drafter token the target spelled whole
                    ng_prob.append(p_t)
                    ng_split.append(True)
                continue
            mapped = int(self.vocab.d2t[toks[n]])
            if m == n and mapped == t:
                dm_rows.append(offset + n - 1)
                dm_idx.append(top.astype(self.idx_dtype))
                dm_logp.append(logp.astype(np.float16))
                dm_tail.append(tail)
                masses.append(mass)
            elif m > n:
                ng_rows.extend(range(offset + n - 1, offset + m))
                ng_prob.extend([p_t] * (m - n + 1))
                ng_split.extend([False] * (m - n + 1))
        k = self.k
        return Record(
            prompt=self.prompt,
            ids=np.asarray(d.ids, dtype=np.int32),
            dm_rows=np.asarray(dm_rows, dtype=np.int32),
            dm_idx=np.asarray(dm_idx, dtype=self.idx_dtype).reshape(-1, k),
            dm_logp=np.asarray(dm_logp, dtype=np.float16).reshape(-1, k),
            dm_tail=np.asarray(dm_tail, dtype=np.float32),
            ng_rows=np.asarray(ng_rows, dtype=np.int32),
            ng_prob=np.asarray(ng_prob, dtype=np.float32) if self.token_probs else None,
            ng_split=np.asarray(ng_split, dtype=bool),
            accepted=accepted,
            proposed=proposed,
            topk_mass=float(np.mean(masses)) if masses else 0.0,
            target_tokens=len(self.spans),
        )
