"""Cross-vocabulary speculative decoding (paper Algorithm 1), gpt-fast style.

One round (``_Run.speculative``), one method per step: ``_draft`` k drafter tokens (the
draft-length policy of runtime/draft_length says when to stop), or ``_copy`` them from the context
where it repeats (runtime/context_lookup.py) or from earlier answers (runtime/answer_memory.py; copies
need no translation) -> ``_translate`` them to m target
tokens -> ``_verify`` all m with ONE target call -> ``_accept`` (greedy: exact argmax match;
sampling: u < p/q'), then a correction or bonus token -> commit, rolling the target's KV cache back
-> ``_resync`` the drafter (re-tokenize the accepted text into its context, harvest n-grams, crop
its KV cache). ``DecodeStats`` counts each round; with ``trace`` each round is kept as a
``RoundTrace``. Backends are reached only through runtime.backends.base.Backend; this module
imports numpy and the runtime's own small modules, nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from omnidraft.errors import ContextOverflow, InvalidArgument
from omnidraft.runtime.answer_memory import AnswerMemory
from omnidraft.runtime.backends.base import fill, last_row, last_row_accept
from omnidraft.runtime.context_lookup import ContextIndex
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.decode_stats import DecodeResult, DecodeStats, RoundTrace
from omnidraft.runtime.draft_length.head_file import require_head
from omnidraft.runtime.draft_length.policy import policy_for
from omnidraft.runtime.exact_proposal import ExactNgrams, exact_ngrams
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


class RandomSource(Protocol):
    """Where the loop's uniform draws come from (``numpy.random.Generator`` is one); a caller that
    records or replays draws passes its own."""

    def random(self) -> float: ...


class SpeculativeDecoder:
    """A drafter/target pair with its direct map, (optional) n-gram cache and (optional) answer memory,
    which learns every generation and proposes in rounds where the context lookup finds nothing."""

    def __init__(
        self,
        target: LoadedModel,
        drafter: LoadedModel | None = None,
        cache: NgramCache | None = None,
        *,
        memory: AnswerMemory | None = None,
    ) -> None:
        if target.info.get("draft_vocab"):
            raise InvalidArgument(
                f"{target.path} is a drafter export whose output layer keeps only "
                f"{target.info['draft_vocab']} tokens (--draft-vocab); a target must score every "
                "token: re-export it without --draft-vocab"
            )
        self.target, self.drafter, self.cache, self.memory = target, drafter, cache, memory
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
        rng: RandomSource | None = None,
    ) -> DecodeResult:
        """Decode ``prompt``. ``on_verified(tokens, logits)`` receives each round's committed target
        tokens with the target logits rows they were accepted or drawn from (row i scores token i), so
        online distillation reuses the verification passes instead of calling the target again.
        ``rng`` supplies the uniform draws (default: ``numpy.random.default_rng(cfg.seed)``)."""
        cfg.validate()
        if not prompt:
            raise InvalidArgument("the prompt is empty; pass some text with --prompt")
        check_text(prompt, what="the prompt", fix="pass UTF-8 text with --prompt")
        tgt = self.target
        ctx_p = list(tgt.codec.start_ids) + tgt.codec.encode(prompt)
        need = len(ctx_p) + cfg.max_new_tokens + cfg.longest_proposal + 1
        if need > tgt.backend.max_seq_len:
            raise ContextOverflow(
                f"prompt ({len(ctx_p)} target tokens) + {cfg.max_new_tokens} new tokens + draft "
                f"{cfg.longest_proposal} needs {need} positions but the target holds {tgt.backend.max_seq_len}; "
                "shorten the prompt or lower --max-new-tokens"
            )
        if cfg.mode != "target-only" and self.drafter is None:
            raise InvalidArgument(f"mode {cfg.mode!r} needs a drafter; pass --drafter or use --mode target-only")
        if cfg.adaptive and cfg.mode != "target-only":
            require_head(self.drafter.backend, self.drafter.path, "--draft-len auto")
        run = _Run(self, prompt, ctx_p, cfg, on_text, trace, rng or np.random.default_rng(cfg.seed))
        run.on_verified = on_verified
        result = run.speculative() if cfg.drafts else run.target_only()
        if self.memory is not None:
            self.memory.add(run.ctx_p)
        return result


@dataclass
class _Draft:
    """What a round's drafting produced."""

    context: list[int]  # the drafter's context it drafted from
    tokens: list[int]
    unfed: list[int]  # the tail drafted but not yet fed to the drafter
    q_rows: list[np.ndarray]  # sampling: the drafter's distribution per drafted token
    uniforms: list[float]
    accept_logits: list[float]
    call_seconds: list[float]  # per drafter call: the online controller replays shorter drafts from these
    exact: ExactNgrams | None  # exact n-gram sampling: each drafted token stands for one target token
    translation: Translation | None  # built while drafting under exact sampling, or copied
    copied: bool = False  # the context lookup's or memory's tokens: each proposed with certainty (q' = 1)
    remembered: bool = False  # copied from the answer memory


class _Run:
    """State of one generation (contexts, random source, stats)."""

    def __init__(
        self,
        dec: SpeculativeDecoder,
        prompt: str,
        ctx_p: list[int],
        cfg: DecodeConfig,
        on_text: Callable[[str], None] | None,
        trace: bool,
        rng: RandomSource,
    ) -> None:
        self.dec, self.prompt, self.cfg, self.ctx_p, self.on_text = dec, prompt, cfg, ctx_p, on_text
        self.n_prompt = len(ctx_p)
        self.greedy = cfg.temperature == 0
        self.rng = rng
        self.stats = DecodeStats()
        self.rounds: list[RoundTrace] | None = [] if trace else None
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
            fill(self.dec.target.backend, self.ctx_p[:-1], 0)
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
        """The round: draft -> translate -> verify -> accept -> commit -> resync the drafter."""
        drf = self.dec.drafter.backend
        self.dctx = DrafterContext(self.dec.drafter.codec, self.prompt, self.cfg.lookbehind)
        if len(self.dctx.ids) >= drf.max_seq_len:
            raise ContextOverflow(
                f"the prompt is {len(self.dctx.ids)} drafter tokens but the drafter holds "
                f"{drf.max_seq_len}; shorten the prompt"
            )
        drf.reset()
        self.cache = self.dec.cache if self.cfg.mode == "ngram" else None
        self.policy = policy_for(self.cfg.draft_len, self.cfg.gamma, self.cfg.max_draft_len, self.cfg.accept_offsets)
        t_start = time.perf_counter()
        self._prefill()
        self.text_pos = len(self.dctx.text)
        lookup = ContextIndex(self.cfg.lookup, self.ctx_p) if self.cfg.lookup is not None else None
        while not self.done:
            d = self._copy(lookup) or self._draft()
            tr = self._translate(d)
            n_ctx = len(self.ctx_p)
            rows, fed, t_verify = self._verify(tr)
            j, extra = self._accept(d, tr, rows)
            self.dec.target.backend.rollback(n_ctx + j)  # `extra` is fed at the next call
            new = self._commit(tr.target_ids[:j] + [extra])
            if self.on_verified is not None and new:
                self.on_verified(new, rows[: len(new)])
            added, kept = self._resync(d, tr, j, new)
            self.stats.record_round(tr, j, self._splits(d, tr), added)
            if lookup is not None:
                lookup.extend(new)
                if d.copied:
                    self.stats.lookup_rounds += 1
                    self.stats.lookup_proposed += len(tr)
                    self.stats.lookup_accepted += j
                if d.remembered:
                    self.stats.memory_rounds += 1
                    self.stats.memory_proposed += len(tr)
                    self.stats.memory_accepted += j
            if self.rounds is not None:
                self.rounds.append(
                    RoundTrace(
                        d.tokens, tr.target_ids, tr.spans, [k is not None for k in tr.keys], j, extra, new,
                        d.uniforms, added, kept, d.context, d.accept_logits, d.call_seconds, fed, t_verify,
                    )
                )  # fmt: skip
        return self._result(t_start)

    def _copy(self, lookup: ContextIndex | None) -> _Draft | None:
        """The round's proposal copied from the context, where its suffix occurred before, else from the
        answer memory (else None: the drafter drafts). No drafter call: its context catches up at the
        next draft."""
        if lookup is None:
            return None
        used = len(self.ctx_p) - self.n_prompt
        room = min(self.dec.target.backend.max_seq_len - len(self.ctx_p), self.cfg.max_new_tokens - used) - 1
        if room <= 0:
            return None
        ids, memory = lookup.propose(room), self.dec.memory
        remembered = not ids and memory is not None
        if remembered:
            ids = memory.propose(self.ctx_p, min(room, self.cfg.lookup.max_tokens))
        if not ids:
            return None
        tr = Translation(list(ids), [(0, 0)] * len(ids), [None] * len(ids))
        return _Draft(self.dctx.ids, [], [], [], [], [], [], None, tr, copied=True, remembered=remembered)

    def _draft(self) -> _Draft:
        """Draft up to K drafter tokens from the drafter's context (its KV cache holds a prefix of it);
        the draft-length policy says when to stop."""
        dec, cfg, drf, vocab, policy = self.dec, self.cfg, self.dec.drafter.backend, self.dec.vocab, self.policy
        mask = dec._draft_mask(cfg.mode, cfg.uses_splits)
        exact = dec._exact_ngrams() if cfg.exact_ngrams else None
        tr = None
        if exact is not None:
            mask, tr = exact.mask, Translation()
        ids_q = self.dctx.ids
        k = min(cfg.k_max, drf.max_seq_len - len(ids_q))
        feed, draft, q_rows, uniforms, call_seconds = ids_q[drf.cached_len :], [], [], [], []
        policy.begin()
        max_ngram = self.cache.max_len if self.cache else 1

        def spans() -> list[tuple[int, int]]:  # the draft so far, translated (the policy may ask)
            return tr.spans if tr is not None else self._translate_draft(draft).spans

        t0 = t_call = time.perf_counter()
        for _ in range(k):
            if drf.cached_len + len(feed) > drf.max_seq_len:
                break  # a fed n-gram tail filled the drafter's cache
            z = 0.0
            if policy.uses_head:
                logits, z = last_row_accept(drf, feed, drf.cached_len)
            else:
                logits = last_row(drf, feed, drf.cached_len)
            if self.greedy:
                t = masked_argmax(logits, mask)
            else:
                q = softmax(logits, cfg.temperature, mask)
                uniforms.append(self.rng.random())
                t = draw(q, uniforms[-1])
                q_rows.append(q)
            draft.append(t)
            feed = [t]
            rest = exact.rest(t) if exact is not None else ()
            if exact is not None:  # the drafted head and its fed sub-tokens are one target token (exact q')
                tr.target_ids.append(int(vocab.d2t[t]) if vocab.d2t[t] >= 0 else exact.target[t])
                tr.spans.append((len(draft) - 1, len(draft) + len(rest)))
                tr.keys.append(exact.key.get(t))
                draft += rest
                feed += rest
            policy.drafted(t, z + drf.accept_bias(t) if policy.uses_head else z, len(rest))
            t_next = time.perf_counter()
            call_seconds.append(t_next - t_call)
            t_call = t_next
            if not policy.more(len(draft), k, spans, max_ngram):
                break
        self.stats.drafter_seconds += time.perf_counter() - t0
        self.stats.drafter_calls += len(draft)
        return _Draft(ids_q, draft, feed, q_rows, uniforms, policy.accept_logits, call_seconds, exact, tr)

    def _translate_draft(self, draft: list[int]) -> Translation:
        return translate(draft, self.dec.vocab, self.cache, self.cfg.uses_splits)

    def _translate(self, d: _Draft) -> Translation:
        """Drafter tokens -> target tokens: cached n-grams (longest first), else the direct map, else a
        split. A split can yield many more target tokens than K, so no more are proposed than the
        budget and the target's KV cache can take (without splits, m <= K always fits); long runs are
        mostly accepted, so a tighter cap only costs speed."""
        tr = d.translation if d.translation is not None else self._translate_draft(d.tokens)
        if self.cfg.uses_splits:
            used = len(self.ctx_p) - self.n_prompt
            room = max(
                0, min(self.dec.target.backend.max_seq_len - len(self.ctx_p), self.cfg.max_new_tokens - used) - 1
            )
            if len(tr) > room:
                tr = Translation(tr.target_ids[:room], tr.spans[:room], tr.keys[:room])
        return tr

    def _verify(self, tr: Translation) -> tuple[np.ndarray, int, float]:
        """One target call over the unverified context and the m proposed tokens; row j scores
        tr[j], row m the bonus position. Returns (rows, tokens fed, seconds)."""
        fed = self.ctx_p[self.dec.target.backend.cached_len :] + tr.target_ids
        t0 = self.stats.target_seconds
        rows = self._target(fed)[-(len(tr) + 1) :]
        return rows, len(fed), self.stats.target_seconds - t0

    def _accept(self, d: _Draft, tr: Translation, rows: np.ndarray) -> tuple[int, int]:
        """Accept while the target agrees (greedy: its argmax; sampling: u < p/q'), then a correction
        drawn from the residual max(0, p - q') or the bonus token. Returns (accepted, extra)."""
        j, m, vocab, exact = 0, len(tr), self.dec.vocab, d.exact
        while j < m:
            t = tr.target_ids[j]
            if self.greedy:
                ok = int(np.argmax(rows[j])) == t
            else:
                p = softmax(rows[j], self.cfg.temperature)
                d.uniforms.append(self.rng.random())
                if exact is not None:
                    q_t = exact.prob(vocab, d.q_rows[j], t)
                elif d.copied:
                    q_t = 1.0
                else:
                    q_t = proposal_prob(j, tr, d.tokens, d.q_rows, vocab)
                ok = d.uniforms[-1] * q_t < p[t]
            if not ok:
                break
            j += 1
        if j == m or self.greedy:
            return j, self._pick(rows[j])
        if exact is not None:
            q_full = exact.lift(vocab, d.q_rows[j], rows.shape[-1])
        elif d.copied:
            q_full = np.zeros(rows.shape[-1])
            q_full[tr.target_ids[j]] = 1.0
        else:
            q_full = q_prime_full(j, tr, d.tokens, d.q_rows, vocab, rows.shape[-1])
        d.uniforms.append(self.rng.random())
        return j, draw(residual(p, q_full), d.uniforms[-1])

    def _splits(self, d: _Draft, tr: Translation) -> list[bool]:
        """Which proposed target tokens came from a split drafter token."""
        if not self.cfg.uses_splits:
            return []
        d2t = self.dec.vocab.d2t
        return [bool(b - a == 1 and tr.keys[i] is None and d2t[d.tokens[a]] < 0) for i, (a, b) in enumerate(tr.spans)]

    def _resync(self, d: _Draft, tr: Translation, j: int, new: list[int]) -> tuple[int, int]:
        """Re-tokenize the committed text into the drafter's context, harvest n-grams from it, and crop
        the drafter's KV cache to the common prefix of what it saw and the new context.
        Returns (n-grams added, drafter positions kept)."""
        codec, drf, cache = self.dec.target.codec, self.dec.drafter.backend, self.cache
        spelled = [codec.spell([t]) for t in new]
        spans = []
        for t, b in zip(new, spelled):
            spans.append((t, self.text_pos, self.text_pos + len(b)))
            self.text_pos += len(b)
        window = self.dctx.append(b"".join(spelled))
        added = 0
        if cache is not None:
            for key in tr.keys[:j]:
                if key is not None:
                    cache.record_hit(key)
            added = harvest_ngrams(window, spans, self.dec.vocab, cache)
        seen, now = d.context + d.tokens[: len(d.tokens) - len(d.unfed)], self.dctx.ids
        lcp, limit = 0, min(drf.cached_len, len(now) - 1)
        while lcp < limit and seen[lcp] == now[lcp]:
            lcp += 1
        drf.rollback(lcp)
        return added, lcp
