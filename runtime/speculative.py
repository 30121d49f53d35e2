"""Cross-vocabulary speculative decoding (paper Algorithm 1), gpt-fast style.

One round: draft k drafter tokens -> translate to m target tokens -> verify all m with ONE target
call -> accept (greedy: exact argmax match; sampling: u < p/q') -> correction or bonus token ->
roll back both KV caches -> re-tokenize the accepted text into the drafter's context -> update the
n-gram cache. Backends are reached only through runtime.backends.base.Backend; this module imports
numpy and the runtime's own small modules, nothing else.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from omnidraft.errors import ContextOverflow, InvalidArgument
from omnidraft.runtime.accept_head import NO_HEAD_FIX, log_sigmoid, may_stop, rejection_prob, validate_adaptive
from omnidraft.runtime.backends.base import has_accept_head, last_row, last_row_accept
from omnidraft.runtime.exact_proposal import FED_LOGIT, ExactNgrams, exact_ngrams
from omnidraft.runtime.loader import LoadedModel
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.sampling import draw, masked_argmax, residual, softmax
from omnidraft.runtime.translate import (
    DrafterContext,
    Translation,
    harvest_ngrams,
    proposal_prob,
    q_prime_full,
    translate,
)
from omnidraft.runtime.vocab import VocabMap, build_vocab_map
from omnidraft.validate import check_text

MODES = ("ngram", "dm", "target-only")
# Sampling with merged n-grams: "exact" proposes only what it can score (runtime/exact_proposal.py);
# "paper" merges every cached n-gram with Eq. 1-2, approximately (tests/test_exact_sampling.py
# measures its gap on an adversarial n-gram).
NGRAM_SAMPLING = ("exact", "paper")


@dataclass
class DecodeConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0
    draft_len: int | str = 4  # K, or "auto": the drafter's acceptance head decides (issue #6)
    mode: str = "ngram"
    seed: int = 0
    lookbehind: int = 8
    gamma: float = 0.5  # auto: stop once P(some drafted token is rejected) > gamma
    max_draft_len: int = 16  # auto: K_max
    splits: bool = True  # ngram mode, greedy: draft unmapped tokens the target spells with several
    speculate: bool = True  # False: plain target steps (runtime.gamma turns drafting off where it loses)
    # auto: logit offsets per drafted token, learned online from past verifications (runtime.accept_online)
    accept_offsets: dict[int, float] | None = None
    ngram_sampling: str = "exact"  # temperature > 0, ngram mode: "exact" | "paper" (NGRAM_SAMPLING)

    @property
    def uses_splits(self) -> bool:
        # Sampling needs q' for every proposed target token (Eq. 1-2), which a split does not define.
        return self.splits and self.mode == "ngram" and self.temperature == 0

    @property
    def exact_ngrams(self) -> bool:
        return self.mode == "ngram" and self.temperature > 0 and self.ngram_sampling == "exact"

    @property
    def adaptive(self) -> bool:
        return self.draft_len == "auto"

    @property
    def k_max(self) -> int:
        return self.max_draft_len if self.adaptive else self.draft_len

    def validate(self) -> None:
        if self.mode not in MODES:
            raise InvalidArgument(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)) or self.temperature < 0:
            raise InvalidArgument(
                f"temperature must be >= 0 and finite (got {self.temperature}); use 0 for greedy decoding"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise InvalidArgument(f"seed must be an integer >= 0 (got {self.seed})")
        if self.ngram_sampling not in NGRAM_SAMPLING:
            raise InvalidArgument(
                f"unknown n-gram sampling rule {self.ngram_sampling!r}; choose one of {', '.join(NGRAM_SAMPLING)}"
            )
        validate_adaptive(self.draft_len, self.gamma, self.max_draft_len)
        if self.max_new_tokens < 1:
            raise InvalidArgument(f"max new tokens must be >= 1 (got {self.max_new_tokens})")


@dataclass
class DecodeStats:
    steps: int = 0  # target calls
    proposed: int = 0  # translated target tokens sent for verification
    accepted: int = 0
    ngram_proposed: int = 0
    ngram_hits: int = 0  # merged n-gram tokens the target accepted
    ngram_added: int = 0
    split_proposed: int = 0  # target tokens proposed through a split drafter token
    split_accepted: int = 0
    drafter_calls: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0  # the target's prompt pass: the same work in every mode
    drafter_seconds: float = 0.0
    target_seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def decode_seconds(self) -> float:
        """Wall time after the target's prompt pass (the paper's per-step convention compares this)."""
        return self.seconds - self.prefill_seconds

    @property
    def overhead_fraction(self) -> float:
        """Share of wall time spent outside the two models (translation, sampling, bookkeeping)."""
        return 1.0 - (self.drafter_seconds + self.target_seconds) / self.seconds if self.seconds else 0.0


@dataclass
class DecodeResult:
    text: str
    token_ids: list[int]
    stats: DecodeStats
    rounds: list[dict] = field(default_factory=list)  # filled only when tracing


class SpeculativeDecoder:
    """A drafter/target pair with its direct map and (optional) n-gram cache."""

    def __init__(
        self, target: LoadedModel, drafter: LoadedModel | None = None, cache: NgramCache | None = None
    ) -> None:
        if target.info.get("draft_vocab"):
            raise InvalidArgument(
                f"{target.path} is a drafter export whose output layer keeps only "
                f"{target.info['draft_vocab']} tokens (--draft-vocab); a target must score every "
                "token: re-export it without --draft-vocab"
            )
        self.target, self.drafter, self.cache = target, drafter, cache
        self.vocab: VocabMap | None = None
        if drafter is not None:
            self.vocab = build_vocab_map(
                drafter.codec, target.codec, drafter.backend.vocab_size, target.backend.vocab_size
            )
        self._mask_key: tuple | None = None
        self._mask: np.ndarray | None = None
        self._exact_key: int | None = None
        self._exact: ExactNgrams | None = None

    def _exact_ngrams(self) -> ExactNgrams:
        """The exact-sampling proposal map of the cache as it is now (rebuilt when its keys change)."""
        key = self.cache.version if self.cache is not None else -1
        if key != self._exact_key:
            self._exact, self._exact_key = exact_ngrams(self.vocab, self.cache), key
        return self._exact

    def _draft_mask(self, mode: str, splits: bool = False) -> np.ndarray:
        """Drafter tokens that can be translated: the direct map, plus n-gram sub-tokens in ngram mode,
        plus split tokens when splits are on."""
        key = (mode, splits, self.cache.version if self.cache is not None else -1)
        if key != self._mask_key:
            mask = self.vocab.dm_mask.copy()
            if splits:
                mask |= self.vocab.split_mask
            if mode == "ngram" and self.cache is not None:
                mask |= self.cache.drafter_tokens
            self._mask, self._mask_key = mask, key
        return self._mask

    def generate(
        self,
        prompt: str,
        cfg: DecodeConfig,
        on_text: Callable[[str], None] | None = None,
        trace: bool = False,
        on_verified: Callable[[list[int], np.ndarray], None] | None = None,
    ) -> DecodeResult:
        """Decode ``prompt``. ``on_verified(tokens, logits)`` receives each round's committed target
        tokens with the target logits rows they were accepted or drawn from (row i scores token i), so
        online distillation reuses the verification passes instead of calling the target again."""
        cfg.validate()
        if not prompt:
            raise InvalidArgument("the prompt is empty; pass some text with --prompt")
        check_text(prompt, what="the prompt", fix="pass UTF-8 text with --prompt")
        tgt = self.target
        ctx_p = list(tgt.codec.start_ids) + tgt.codec.encode(prompt)
        need = len(ctx_p) + cfg.max_new_tokens + cfg.k_max + 1
        if need > tgt.backend.max_seq_len:
            raise ContextOverflow(
                f"prompt ({len(ctx_p)} target tokens) + {cfg.max_new_tokens} new tokens + draft "
                f"{cfg.k_max} needs {need} positions but the target holds {tgt.backend.max_seq_len}; "
                "shorten the prompt or lower --max-new-tokens"
            )
        if cfg.mode != "target-only" and self.drafter is None:
            raise InvalidArgument(f"mode {cfg.mode!r} needs a drafter; pass --drafter or use --mode target-only")
        if cfg.adaptive and cfg.mode != "target-only" and not has_accept_head(self.drafter.backend):
            be = self.drafter.backend.name
            why = (
                "ExecuTorch drafters do not carry an acceptance head yet; use an ONNX or Hugging Face drafter, "
                "or a fixed --draft-len K"
                if be == "executorch"
                else NO_HEAD_FIX
            )
            raise InvalidArgument(
                f"--draft-len auto needs a drafter with an acceptance head, and {self.drafter.path} has none; {why}"
            )
        run = _Run(self, prompt, ctx_p, cfg, on_text, trace)
        run.on_verified = on_verified
        return run.target_only() if cfg.mode == "target-only" or not cfg.speculate else run.speculative()


class _Run:
    """State of one generation (contexts, rng, stats)."""

    def __init__(
        self,
        dec: SpeculativeDecoder,
        prompt: str,
        ctx_p: list[int],
        cfg: DecodeConfig,
        on_text: Callable[[str], None] | None,
        trace: bool,
    ) -> None:
        self.dec, self.prompt, self.cfg, self.ctx_p, self.on_text = dec, prompt, cfg, ctx_p, on_text
        self.n_prompt = len(ctx_p)
        self.greedy = cfg.temperature == 0
        self.rng = np.random.default_rng(cfg.seed)
        self.stats = DecodeStats()
        self.rounds: list[dict] | None = [] if trace else None
        self.eos = dec.target.eos_ids
        self.text_out = bytearray()
        self.emitted = 0
        self.done = False
        self.on_verified: Callable[[list[int], np.ndarray], None] | None = None
        dec.target.backend.reset()

    def _target(self, tokens: list[int]) -> np.ndarray:
        be = self.dec.target.backend
        t0 = time.perf_counter()
        logits = be.forward(tokens, be.cached_len)
        self.stats.target_seconds += time.perf_counter() - t0
        self.stats.steps += 1
        return logits

    def _prefill(self) -> None:
        """Feed the target every prompt token but the last, timed apart: that pass is identical in
        every mode, so decode speed can be compared without it (the last token starts decoding)."""
        if len(self.ctx_p) > 1:
            t0 = time.perf_counter()
            self.dec.target.backend.forward(self.ctx_p[:-1], 0)
            self.stats.prefill_seconds += time.perf_counter() - t0

    def _pick(self, logits: np.ndarray) -> int:
        return int(np.argmax(logits)) if self.greedy else draw(softmax(logits, self.cfg.temperature), self.rng.random())

    def _commit(self, new: list[int]) -> list[int]:
        """Append target tokens, stopping at EOS or the token budget; stream the text."""
        budget = self.cfg.max_new_tokens - (len(self.ctx_p) - self.n_prompt)
        new = new[:budget]
        for n, t in enumerate(new):
            if t in self.eos:
                new = new[: n + 1]
                self.done = True
                break
        self.ctx_p += new
        if len(self.ctx_p) - self.n_prompt >= self.cfg.max_new_tokens:
            self.done = True
        self.text_out += self.dec.target.codec.spell([t for t in new if t not in self.eos])
        if self.on_text is not None:
            text = self.text_out.decode("utf-8", errors="ignore")
            if len(text) > self.emitted:
                self.on_text(text[self.emitted :])
                self.emitted = len(text)
        return new

    def _result(self, t_start: float) -> DecodeResult:
        self.stats.new_tokens = len(self.ctx_p) - self.n_prompt
        self.stats.seconds = time.perf_counter() - t_start
        return DecodeResult(
            self.text_out.decode("utf-8", errors="replace"), self.ctx_p[self.n_prompt :], self.stats, self.rounds or []
        )

    def target_only(self) -> DecodeResult:
        t_start = time.perf_counter()
        self._prefill()
        be = self.dec.target.backend
        while not self.done:
            logits = self._target(self.ctx_p[be.cached_len :])[-1]
            new = self._commit([self._pick(logits)])
            if self.on_verified is not None and new:
                self.on_verified(new, logits[None, :])
        return self._result(t_start)

    def speculative(self) -> DecodeResult:
        dec, cfg, st = self.dec, self.cfg, self.stats
        drf, tgt, vocab = dec.drafter.backend, dec.target.backend, dec.vocab
        cache = dec.cache if cfg.mode == "ngram" else None
        dctx = DrafterContext(dec.drafter.codec, self.prompt, cfg.lookbehind)
        if len(dctx.ids) >= drf.max_seq_len:
            raise ContextOverflow(
                f"the prompt is {len(dctx.ids)} drafter tokens but the drafter holds "
                f"{drf.max_seq_len}; shorten the prompt"
            )
        drf.reset()
        t_start = time.perf_counter()
        self._prefill()
        text_pos = len(dctx.text)
        while not self.done:
            # 1) Draft up to k tokens in the drafter's vocabulary (its KV cache holds ids_q[:cached]).
            #    Adaptive (draft_len "auto"): stop once 1 - prod(P(accept)) > gamma, checked only where the
            #    draft translates cleanly. A draft ending inside an n-gram (or on a sub-token with no direct
            #    mapping) would lose its tail in translation and its product would count tokens the target
            #    never sees, so drafting goes on until the tokens close a target token (or K_max, or the
            #    tail can no longer become an n-gram); the product over those drafter tokens is then the
            #    product over the merged target tokens.
            mask = dec._draft_mask(cfg.mode, cfg.uses_splits)
            exact = dec._exact_ngrams() if cfg.exact_ngrams else None
            if exact is not None:  # each sampled drafter token stands for one target token (exact q')
                mask, tr = exact.mask, Translation()
            offsets = cfg.accept_offsets or {}
            ids_q = dctx.ids
            k = min(cfg.k_max, drf.max_seq_len - len(ids_q))
            feed, draft, q_rows, uniforms, log_acc, acc_p = ids_q[drf.cached_len :], [], [], [], 0.0, []
            t0 = t_call = time.perf_counter()
            call_seconds = []  # per drafter call: the gamma controller replays shorter drafts from these
            for _ in range(k):
                if drf.cached_len + len(feed) > drf.max_seq_len:
                    break  # a fed n-gram tail filled the drafter's cache
                if cfg.adaptive:
                    logits, z = last_row_accept(drf, feed, drf.cached_len)
                else:
                    logits = last_row(drf, feed, drf.cached_len)
                if self.greedy:
                    d = masked_argmax(logits, mask)
                else:
                    q = softmax(logits, cfg.temperature, mask)
                    uniforms.append(self.rng.random())
                    d = draw(q, uniforms[-1])
                    q_rows.append(q)
                draft.append(d)
                if cfg.adaptive:  # the head's logit for row r, plus the bias of the token drafted from it
                    acc_p.append(z + drf.accept_bias(d) + offsets.get(d, 0.0))
                    log_acc += log_sigmoid(acc_p[-1])
                feed = [d]
                if exact is not None:
                    rest = exact.rest(d)
                    tr.target_ids.append(int(vocab.d2t[d]) if vocab.d2t[d] >= 0 else exact.target[d])
                    tr.spans.append((len(draft) - 1, len(draft) + len(rest)))
                    tr.keys.append(exact.key.get(d))
                    draft += rest
                    feed += rest
                    acc_p += [FED_LOGIT] * (len(rest) if cfg.adaptive else 0)
                t_next = time.perf_counter()
                call_seconds.append(t_next - t_call)
                t_call = t_next
                if (
                    cfg.adaptive
                    and len(draft) < k
                    and rejection_prob(log_acc) > cfg.gamma
                    and may_stop(
                        (tr if exact is not None else translate(draft, vocab, cache, cfg.uses_splits)).spans,
                        len(draft),
                        cache.max_len if cache else 1,
                    )
                ):
                    break
            st.drafter_seconds += time.perf_counter() - t0
            st.drafter_calls += len(draft)
            # 2) Translate to target tokens: cached n-grams (longest first), else the direct map, else a
            #    split. A split can yield many more target tokens than K: propose no more than the
            #    budget and the target's KV cache can take (without splits, m <= K always fits). A
            #    tighter cap (8 tokens) cost adapted code 10 % decode speed: long runs are mostly accepted.
            if exact is None:
                tr = translate(draft, vocab, cache, cfg.uses_splits)
            if cfg.uses_splits:
                room = max(
                    0,
                    min(tgt.max_seq_len - len(self.ctx_p), cfg.max_new_tokens - (len(self.ctx_p) - self.n_prompt)) - 1,
                )
                if len(tr) > room:
                    tr = Translation(tr.target_ids[:room], tr.spans[:room], tr.keys[:room])
            m = len(tr)
            # 3) Verify all m with one target call; rows[j] scores tr[j], rows[m] the bonus position.
            n_ctx = len(self.ctx_p)
            fed = self.ctx_p[tgt.cached_len :] + tr.target_ids
            t_verify = st.target_seconds
            rows = self._target(fed)[-(m + 1) :]
            t_verify = st.target_seconds - t_verify
            # 4) Accept while the target agrees; then a correction (residual) or a bonus token.
            j = 0
            while j < m:
                t = tr.target_ids[j]
                if self.greedy:
                    ok = int(np.argmax(rows[j])) == t
                else:
                    p = softmax(rows[j], cfg.temperature)
                    uniforms.append(self.rng.random())
                    q_t = (
                        exact.prob(vocab, q_rows[j], t)
                        if exact is not None
                        else proposal_prob(j, tr, draft, q_rows, vocab)
                    )
                    ok = uniforms[-1] * q_t < p[t]
                if not ok:
                    break
                j += 1
            if j < m and not self.greedy:
                if exact is not None:
                    q_full = exact.lift(vocab, q_rows[j], rows.shape[-1])
                else:
                    q_full = q_prime_full(j, tr, draft, q_rows, vocab, rows.shape[-1])
                uniforms.append(self.rng.random())
                extra = draw(residual(p, q_full), uniforms[-1])
            else:
                extra = self._pick(rows[j])
            # 5) Roll the target back to the accepted prefix; `extra` is fed at the next call.
            tgt.rollback(n_ctx + j)
            st.proposed += m
            st.accepted += j
            hits = [tr.keys[i] for i in range(j) if tr.keys[i] is not None]
            st.ngram_proposed += sum(key is not None for key in tr.keys)
            st.ngram_hits += len(hits)
            if cfg.uses_splits:
                split = [
                    bool(b - a == 1 and tr.keys[i] is None and vocab.d2t[draft[a]] < 0)
                    for i, (a, b) in enumerate(tr.spans)
                ]
                st.split_proposed += sum(split)
                st.split_accepted += sum(split[:j])
            new = self._commit(tr.target_ids[:j] + [extra])
            if self.on_verified is not None and new:
                self.on_verified(new, rows[: len(new)])
            # 6) Reverse translation: re-tokenize the accepted text for the drafter, harvest n-grams.
            spelled = [dec.target.codec.spell([t]) for t in new]
            spans = []
            for t, b in zip(new, spelled):
                spans.append((t, text_pos, text_pos + len(b)))
                text_pos += len(b)
            window = dctx.append(b"".join(spelled))
            added = 0
            if cache is not None:
                for key in hits:
                    cache.record_hit(key)
                added = harvest_ngrams(window, spans, vocab, cache)
                st.ngram_added += added
            # Crop the drafter's cache to the common prefix of what it saw and the new context.
            seen, now = ids_q + draft[: len(draft) - len(feed)], dctx.ids  # `feed` was drafted, never fed
            lcp = 0
            limit = min(drf.cached_len, len(now) - 1)
            while lcp < limit and seen[lcp] == now[lcp]:
                lcp += 1
            drf.rollback(lcp)
            if self.rounds is not None:
                self.rounds.append(
                    {
                        "draft": draft,
                        "target_ids": tr.target_ids,
                        "spans": tr.spans,
                        "merged": [k is not None for k in tr.keys],
                        "accepted": j,
                        "extra": extra,
                        "committed": new,
                        "uniforms": uniforms,
                        "ngram_added": added,
                        "drafter_cache_kept": lcp,
                        "context": ids_q,
                        "accept_logits": acc_p,
                        "drafter_call_seconds": call_seconds,
                        "target_fed": len(fed),
                        "target_seconds": t_verify,
                    }
                )
        return self._result(t_start)
