"""Online tuning of adaptive drafting's stopping rule, one controller per stream (paper §4.1: gamma
0.3 suits text, 0.7 code/math, "choose it per task, then adjust it from online performance").

Comparing gammas by the tokens/s of successive prompts does not work on a short stream: one
prompt's throughput differs from the next by far more than a gamma step changes it (a hill climb
on the bundled pair drifted to 0.84 on code, where a fixed 0.1 ran 1.59x target-only against 1.37x
for the best fixed K). Instead every decoded prompt is *replayed* under each candidate setting
that drafts no longer than the one that ran:

- verification accepts token i independently of how many tokens follow it, so a draft cut after
  s drafter tokens would have got min(accepted, m') + 1 tokens, m' being the target tokens the
  first s drafter tokens translate to (greedy: exactly; sampling: the same count, another draw);
- when all of a shorter draft is accepted, the rounds that follow draft the same tokens from the
  same context, so the replay chains shorter rounds through their bonus tokens up to the
  rejection the real round hit (``_replay``);
- each replayed round costs its drafter calls (their measured seconds) and a verification
  (per-call and per-token seconds, fitted on every round so far), plus the per-round overhead
  measured outside the two models.

The candidates are gamma (a grid in logit space) x a cap on the draft length (K_max). The cap
matters where the head is overconfident: then no gamma stops drafting early enough, and the
replay finds that capping the draft is faster.

Moving down needs evidence from several windows. A shorter candidate must be faster over the
windows since the kept setting was chosen (at least ``min_windows``, the last ``horizon``): its
pooled replayed tokens / seconds must beat the kept setting's by ``margin``. It must also be
faster consistently: the per-window log speed ratio must average more than two standard errors
above zero. Moving on each window's best of ~50 replays chased noise. On code it drifted to gamma
0.05 with a cap of 2 and took a dozen windows to climb back. On text, a window whose prompts fall
into a repetition loop the head is sure of favours a cap of 1 by 2x. Yet over 48 text prompts,
uncapped gamma 0.5 ran 7-11 % faster than the best fixed K in three lockstep runs.

Moving up needs a probe, since longer drafts cannot be replayed: now and then a window runs one
notch longer on both axes, so every setting in between is replayed from it. The probe is compared
with the kept setting on the same rounds; it is kept if it is not slower (ties cross plateaus where
a binding cap makes gamma moot), and one that is faster is followed by the next probe at once, so
a long climb takes a window per notch. (Climbing 1, 2, 4 notches after consecutive wins was no
faster on the bundled pair: the long probes overshot and lost; docs/decisions.md.)
One that is not faster doubles the gap before the next (up to ``max_gap`` windows).

Below the shortest draft there is one more setting: no drafting at all (``k_max`` 0, plain target
steps). Where the drafter is rarely right (math on the bundled pair: acceptance ~0.13) every
draft length is slower than the target alone (K=1 ran 0.73x target-only), so the stopping rule,
which always drafts at least one token, cannot help. The replay prices a plain step from the same
verification fit (one fed token) plus the loop overhead measured on plain prompts (on 32 text
prompts it replayed 231 tok/s where target-only measured 249: slightly pessimistic). Turning off
is judged apart from the other moves: per window, the plain-step replay against that window's
fastest drafting setting (the max over all of them, which favours drafting), pooled over at least
``off_windows`` (5) windows that drafting moves do not reset, consistently faster and by
``off_margin`` (10 %). While off, prompts decode with the target alone, and the usual probes try
again the fastest drafting setting of the windows that turned it off, so a stream that becomes
predictable (the drafter keeps training) turns drafting back on. ``allow_off=False`` keeps K
within [1, K_max].

The controller also owns the head's per-drafted-token offsets (runtime/draft_length/calibration.py), learned
from the same traced rounds and handed to the loop by ``configure`` (``token_lr`` 0 turns them off).

Deterministic given the timings; no clock is read here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omnidraft.errors import InvalidArgument
from omnidraft.runtime.draft_length.calibration import TokenCalibration
from omnidraft.runtime.draft_length.policy import log_sigmoid

if TYPE_CHECKING:
    from omnidraft.runtime.decode_stats import RoundTrace

GAMMAS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
CAPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def _replay(r: RoundTrace, gamma: float, cap: int) -> tuple[int, list[tuple[int, int, int]]]:
    """Replay one traced round at (gamma, cap), which drafts no longer than the setting that ran.

    A shorter draft whose tokens are all accepted ends with the target's bonus token (the next
    drafted token, which the target accepted) and is followed by another round that drafts the
    same tokens from the same context; the chain goes on until it reaches the rejection the round
    that ran hit, or until a bonus token ends inside a drafter token (then the chain stops there). Returns (tokens, [(first, stop, m) per replayed round: its slice of the drafter
    tokens and the target tokens it verifies]).
    """
    z, spans, j, n = r.accept_logits, r.spans, r.accepted, len(r.draft)
    m, got = len(spans), len(r.committed)
    ends = {b for _, b in spans}
    tokens, t0, drafts = 0, 0, []
    while tokens < got:
        d0 = spans[t0][0] if t0 < m else n
        log_acc, s = 0.0, n
        for i in range(d0 + 1, n + 1):
            log_acc += log_sigmoid(z[i - 1]) if i - 1 < len(z) else 0.0
            if i - d0 >= cap or (-math.expm1(log_acc) > gamma and i in ends):
                s = i
                break
        m_sub = sum(1 for a, b in spans[t0:] if b <= s)
        drafts.append((d0, s, m_sub))
        if t0 + m_sub >= j or t0 + m_sub + 1 >= m:
            tokens += min(j, t0 + m_sub) - t0 + 1  # the rejection (or the round's own end) is reached
            break
        tokens += m_sub + 1  # all accepted + the bonus token
        t0 += m_sub + 1
        if spans[t0 - 1] == spans[t0]:
            # The bonus was the first of several target tokens one drafter token spells (a split):
            # the drafter, seeing part of that token, would not draft the rest the same way.
            break
    return min(tokens, got), drafts


def _pooled(wins: list[tuple[float, float, float, float]], min_windows: int) -> tuple[float, bool]:
    """(pooled speed ratio of a candidate to its reference, whether the per-window log ratio is
    consistently above zero: mean two standard errors up) over ``wins`` = per window (candidate
    tokens, seconds, reference tokens, seconds); (0, False) with fewer than ``min_windows``."""
    if len(wins) < min_windows or any(w[0] <= 0 or w[1] <= 0 or w[2] <= 0 or w[3] <= 0 for w in wins):
        return 0.0, False
    ratio = (sum(w[0] for w in wins) / sum(w[1] for w in wins)) / (sum(w[2] for w in wins) / sum(w[3] for w in wins))
    logs = [math.log((w[0] / w[1]) / (w[2] / w[3])) for w in wins]
    mean = sum(logs) / len(logs)
    se = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1) / len(logs))
    return ratio, mean - 2 * se > 0


@dataclass
class GammaController:
    gamma: float = 0.5
    k_max: int = 16  # the cap to start from
    k_limit: int | None = None  # the largest cap it may choose (default: k_max); the KV-cache room
    window: int = 2  # prompts per decision
    explore_every: int = 1  # windows between probes of a longer setting, doubled after each
    max_gap: int = 4  # probe that loses, up to max_gap, and reset by one that wins
    lo: float = 0.05
    hi: float = 0.95
    margin: float = 0.03  # how much faster (pooled) a shorter setting must be to move to it
    min_windows: int = 3  # windows pooled before moving down
    horizon: int = 8  # the most recent windows pooled (the drafter and head keep training)
    allow_off: bool = True  # may turn drafting off (k_max 0) where plain target steps are faster
    off_margin: float = 0.10  # how much faster (pooled) plain steps must be than every drafting setting
    off_windows: int = 5  # windows pooled before turning drafting off
    token_lr: float = 0.5  # per-drafted-token head correction (runtime/draft_length/calibration.py); 0: off
    history: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 < self.lo <= self.gamma <= self.hi < 1:
            raise InvalidArgument(f"gamma {self.gamma} must lie within [{self.lo}, {self.hi}] for online tuning")
        if self.window < 1 or self.explore_every < 1 or self.max_gap < self.explore_every:
            raise InvalidArgument("gamma tuning needs window >= 1 and 1 <= explore_every <= max_gap")
        if not (
            self.margin >= 0 and self.off_margin >= 0 and 2 <= self.min_windows <= self.off_windows <= self.horizon
        ):
            raise InvalidArgument(
                f"gamma tuning needs margin, off_margin >= 0 and 2 <= min_windows <= off_windows <= "
                f"horizon (got {self.margin}, {self.off_margin}, {self.min_windows}, "
                f"{self.off_windows}, {self.horizon})"
            )
        self.k_limit = self.k_max if self.k_limit is None else self.k_limit
        self.calibration = TokenCalibration(self.token_lr)
        if not isinstance(self.k_max, int) or not 1 <= self.k_max <= self.k_limit:
            raise InvalidArgument(f"K_max must be within [1, {self.k_limit}] (got {self.k_max})")
        self.gammas = sorted({g for g in GAMMAS if self.lo <= g <= self.hi} | {self.lo, self.hi, self.gamma})
        self.caps = sorted({c for c in CAPS if c < self.k_limit} | {self.k_limit, self.k_max})
        self._fit = [0, 0.0, 0.0, 0.0, 0.0]  # rounds, sum fed, sum seconds, sum fed^2, sum fed*seconds
        self._plain = [0, 0.0]  # plain target steps, their seconds outside the target
        self._reset_window()
        self._since_probe, self._gap = 0, self.explore_every
        self._cur = (self.gamma, self.k_max)  # the setting kept; (gamma, k_max) is what runs next
        self._resume = (self.gamma, 1)  # while off: the drafting setting a probe tries
        self._off_ratio: float | None = None  # pooled plain / fastest drafting setting, last window
        self._off_pool: list[tuple[float, float, float, float]] = []  # per window: plain vs its fastest draft
        self._on_totals: dict[tuple[float, int], list[float]] = {}  # drafting candidates' replayed totals
        # per shorter candidate, per window since the kept setting was chosen: (its replayed tokens,
        # seconds, the kept setting's replayed tokens, seconds)
        self._pool: dict[tuple[float, int], list[tuple[float, float, float, float]]] = {}

    def _reset_window(self) -> None:
        self._rounds: list[RoundTrace] = []
        self._other = 0.0  # seconds outside the two models (translation, bookkeeping)
        self._measured = [0, 0.0]  # tokens, decode seconds of the setting that ran
        self._n = 0

    def _candidates(self) -> list[tuple[float, int]]:
        return [(g, c) for g in self.gammas if g <= self.gamma + 1e-12 for c in self.caps if c <= self.k_max]

    def observe(self, result: Any) -> None:
        """Record one decoded prompt (a DecodeResult traced with ``trace=True``); after a full window
        the controller's ``gamma`` and ``k_max`` change. Apply them with ``configure``."""
        rounds, fit = result.rounds, self._fit
        if self.k_max == 0:  # decoded without drafting: plain steps, one fed token each
            st = result.stats
            fit[0] += st.steps
            fit[1] += st.steps
            fit[2] += st.target_seconds
            fit[3] += st.steps
            fit[4] += st.target_seconds
            self._plain[0] += st.steps
            self._plain[1] += max(0.0, st.decode_seconds - st.target_seconds)
            rounds = []
        elif result.stats.steps and not rounds:
            raise InvalidArgument("gamma tuning replays each round: decode with trace=True")
        for r in rounds:
            fit[0] += 1
            fit[1] += r.target_fed
            fit[2] += r.target_seconds
            fit[3] += r.target_fed**2
            fit[4] += r.target_fed * r.target_seconds
        modelled = sum(sum(r.drafter_call_seconds) + r.target_seconds for r in rounds)
        if self.k_max:
            self._other += max(0.0, result.stats.decode_seconds - modelled)
        self._rounds.extend(rounds)
        self.calibration.observe(rounds)
        self._measured[0] += result.stats.new_tokens
        self._measured[1] += result.stats.decode_seconds
        self._n += 1
        if self._n >= self.window:
            self._decide()

    def verify_cost(self) -> tuple[float, float]:
        """(seconds per verification call, seconds per verified token), least squares on every round."""
        n, sx, sy, sxx, sxy = self._fit
        if n == 0:
            return 0.0, 0.0
        den = n * sxx - sx * sx
        per_token = max(0.0, (n * sxy - sx * sy) / den) if n >= 2 and den > 0 else 0.0
        return max(0.0, (sy - per_token * sx) / n), per_token

    def _replayed(self, gamma: float, cap: int) -> tuple[int, float]:
        per_call, per_token = self.verify_cost()
        other = self._other / len(self._rounds) if self._rounds else 0.0
        tokens, secs = 0, 0.0
        for r in self._rounds:
            t, drafts = _replay(r, gamma, cap)
            calls = r.drafter_call_seconds
            tokens += t
            # Each verification feeds the previous round's last token plus the m it checks.
            secs += sum(sum(calls[d0:s]) + per_call + other + per_token * (m + 1) for d0, s, m in drafts)
        return tokens, secs

    def _replayed_off(self) -> tuple[int, float]:
        """The window's tokens decoded by plain target steps: one step per token."""
        per_call, per_token = self.verify_cost()
        other = self._plain[1] / self._plain[0] if self._plain[0] else 0.0
        tokens = sum(len(r.committed) for r in self._rounds)
        return tokens, tokens * (per_call + per_token + other)

    def _note_off(self, replayed: dict, off_key: tuple[float, int]) -> None:
        """Evidence for turning drafting off, kept apart from the pool (drafting moves do not reset
        it): each window's plain-step replay against that window's fastest drafting setting."""
        on = {c: ts for c, ts in replayed.items() if c[1] and ts[1] > 0}
        if not on:
            return
        for c, (t, sec) in on.items():
            acc = self._on_totals.setdefault(c, [0.0, 0.0])
            acc[0] += t
            acc[1] += sec
        top = max(on, key=lambda c: on[c][0] / on[c][1])
        self._off_pool.append((*replayed[off_key], *on[top]))
        del self._off_pool[: -self.horizon]

    def _decide(self) -> None:
        ran, cur = (self.gamma, self.k_max), self._cur
        self._off_ratio = None
        replayed = {c: self._replayed(*c) for c in self._candidates()} if self._rounds else {}
        off_key = (cur[0], 0)  # gamma is moot when off; the kept one is kept
        if replayed and (self.allow_off or cur[1] == 0):
            replayed[off_key] = self._replayed_off()
        rates = {c: t / s if s > 0 else 0.0 for c, (t, s) in replayed.items()}
        if replayed and self.allow_off and cur[1]:
            self._note_off(replayed, off_key)
        moved = False
        if not replayed:
            pass  # a window without drafting: nothing to replay, only the probe schedule moves on
        elif ran != cur:
            # A probe: the setting it left is replayed from the same rounds, so the comparison is paired.
            # A tie (within 0.1 %: a binding cap makes gamma moot and vice versa) also moves up, so a
            # plateau is crossed, and keeps the pooled evidence (it compared shorter settings with one
            # just as fast); only a win makes the next probe come at once.
            win = rates[ran] > rates[cur] * 1.001
            if rates[ran] >= rates[cur] * 0.999:
                cur, moved = ran, win
            self._gap = 0 if win else min(max(self.explore_every, self._gap * 2), self.max_gap)
        if replayed and not moved:
            # Moving down needs the candidate to be faster over the windows since the kept setting was
            # chosen (total replayed tokens over total replayed seconds: the stream's throughput) and
            # consistently so (mean per-window log ratio two standard errors above zero). One window's
            # prompts can favour another setting 2x (a repetition loop the head is sure of) while over
            # the stream that setting is 10 % slower; a consistent 7 % moves after min_windows.
            base = replayed[cur]
            for c, ts in replayed.items():
                if c[1] and c[0] <= cur[0] + 1e-12 and c[1] <= cur[1] and c != cur:
                    self._pool.setdefault(c, []).append((*ts, *base))
                    del self._pool[c][: -self.horizon]
            best, best_ratio = None, 1.0 + self.margin
            for c, wins in self._pool.items():
                ratio, consistent = _pooled(wins, self.min_windows)
                if ratio > best_ratio and consistent:
                    best, best_ratio = c, ratio
            off, consistent = _pooled(self._off_pool, self.off_windows)
            self._off_ratio = off or None
            if consistent and off > 1.0 + self.off_margin:
                best = off_key
                self._resume = max(self._on_totals, key=lambda c: self._on_totals[c][0] / self._on_totals[c][1])
            if best is not None:
                cur, moved = best, True
        if moved:
            self._pool = {}
            if cur[1] == 0:  # turned off: its evidence starts over, and the first probe back waits its gap
                self._off_pool, self._on_totals, self._since_probe = [], {}, 0
        self._since_probe += 1
        probing = self._since_probe > self._gap
        g, cap = cur
        if probing:  # one notch longer on both axes: every setting in between is replayed from it
            up_g = min((x for x in self.gammas if x > g), default=g)
            up_c = min((x for x in self.caps if x > cap and x <= self.k_limit), default=cap)
            if cap == 0:
                # Off: probe the fastest drafting setting of the windows that turned it off. One notch
                # (a one-token draft) can be slower than plain steps where a three-token draft is
                # faster (text on the bundled pair), and a probe can only move to the setting it ran.
                up_g, up_c = self._resume
            probing = (up_g, up_c) != cur
            if probing:
                self._since_probe = 0
                g, cap = up_g, up_c
        measured = self._measured[0] / self._measured[1] if self._measured[1] > 0 else 0.0
        self.history.append(
            {
                "tokens_per_s": round(measured, 3),
                "replayed_tokens_per_s": round(rates[ran], 3) if ran in rates else None,
                "gamma_was": round(ran[0], 4),
                "k_max_was": ran[1],
                "best": [round(cur[0], 4), cur[1]],
                "best_tokens_per_s": round(rates[cur], 3) if cur in rates else None,
                "probe": probing,
                "gamma": round(g, 4),
                "k_max": cap,
                "off_vs_best_drafting": None if self._off_ratio is None else round(self._off_ratio, 4),
            }
        )
        self._cur = cur
        self.gamma, self.k_max = g, cap
        self._reset_window()

    def configure(self, cfg: Any) -> None:
        """Set a DecodeConfig's gamma and K_max to the controller's current choice (K_max 0: decode
        the next prompts with the target alone), and the head's per-token offsets."""
        cfg.gamma, cfg.max_draft_len = self.gamma, self.k_max
        cfg.accept_offsets = dict(self.calibration.offsets) if self.token_lr else None
