"""Loop vectors for the Android core: whole runs of ``runtime.speculative`` recorded call by call.

The pair is scripted and deterministic (no weights needed): each model knows a target text and
favours the longest token of its own vocabulary that continues it, with a few hash-chosen
alternatives, so drafts are often right, sometimes wrong, and the two tokenizers disagree on token
boundaries (which is what fills the n-gram cache). Rows are float32 with a constant floor; a row is
stored sparsely as the floor plus the entries above it, which *is* the full row the Python loop
saw, so the Java replay reconstructs every logit exactly.

Each run records, in order: every model call (tokens, start position, rows), every rollback and
reset, every uniform the loop drew from its numpy generator, the per-round trace, the committed
tokens, the text, the stats and the n-gram cache file bytes before and after.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from omnidraft.runtime.context_lookup import LookupConfig
from omnidraft.runtime.decode_config import DecodeConfig
from omnidraft.runtime.decode_stats import RoundTrace
from omnidraft.runtime.loader import LoadedModel
from omnidraft.runtime.ngram_cache import NgramCache
from omnidraft.runtime.speculative import SpeculativeDecoder
from omnidraft.runtime.tokenizer import TokenCodec

FLOOR = np.float32(-12.0)


def _h(*parts: object) -> int:
    """Stable hash (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


class ScriptedModel:
    """Backend protocol; logits favour continuing ``script`` with this model's own longest tokens."""

    name = "scripted"

    def __init__(
        self, codec: TokenCodec, script: str, eos_id: int, salt: str, slip: float, max_seq_len: int = 1024
    ) -> None:
        self.codec, self.salt, self.slip = codec, salt, slip
        self.script = script.encode("utf-8")
        self.eos_id = eos_id
        self.vocab_size = codec.vocab_size
        self.max_seq_len = max_seq_len
        self._seq: list[int] = []
        self._by_bytes: dict[bytes, int] = {}
        for i, b in enumerate(codec.token_bytes):
            if b and i not in codec.special:
                self._by_bytes.setdefault(b, i)
        self._maxlen = max(len(b) for b in self._by_bytes)
        # The script as this model's own tokenizer writes it (with SentencePiece's leading space), so
        # a well-behaved model proposes the tokens its tokenizer would produce.
        ids = codec.encode(script)
        self._text = codec.spell(ids)
        self._canon: dict[int, int] = {}
        pos = 0
        for t in ids:
            self._canon.setdefault(pos, t)
            pos += len(codec.token_bytes[t])

    @property
    def cached_len(self) -> int:
        return len(self._seq)

    def _prefix_tokens(self, rest: bytes) -> list[int]:
        """Vocabulary tokens that spell a prefix of ``rest``, longest first."""
        out = []
        for n in range(min(self._maxlen, len(rest)), 0, -1):
            t = self._by_bytes.get(rest[:n])
            if t is not None:
                out.append(t)
        return out

    def _row(self, context: list[int]) -> np.ndarray:
        row = np.full(self.vocab_size, FLOOR, dtype=np.float32)
        at = len(self.codec.spell([t for t in context if t not in self.codec.special]))
        key = (self.salt, len(context), tuple(context[-3:]))
        # Continue the script from the same byte offset even after a deviation, so runs stay readable.
        rest = self._text[at:]
        if rest:
            cands = self._prefix_tokens(rest)[:4]
            canon = self._canon.get(at)
            if canon is not None:
                cands = [canon] + [t for t in cands if t != canon][:3]
        else:
            cands = [self.eos_id]
        # Favourite, then shorter continuations, then a few hash-chosen distractors; steps of 1/16 are exact in float32.
        # Probabilities are spread (not one-hot) so that min(1, p/q') and the residual decide real cases.
        values = [4.0 + (_h(key, "f") % 32) / 16] + [
            3.0 - 0.75 * i + (_h(key, i) % 32) / 16 for i in range(1, len(cands))
        ]
        for n in range(3):
            cands.append(_h(key, "d", n) % self.vocab_size)
            values.append(0.5 + (_h(key, "v", n) % 48) / 16)
        if _h(key, "slip") % 1000 < self.slip * 1000:
            values[0], values[-1] = values[-1], values[0] + 0.5  # a confident mistake
        for t, v in zip(cands, values):
            row[t] = max(row[t], np.float32(v))
        return row

    def forward(self, token_ids, start_pos):
        if start_pos != len(self._seq):
            raise ValueError(f"{self.salt}: forward at {start_pos} but cache holds {len(self._seq)}")
        rows = []
        for t in token_ids:
            self._seq.append(int(t))
            rows.append(self._row(self._seq))
        return np.stack(rows)

    def rollback(self, length):
        del self._seq[length:]

    def reset(self):
        self._seq.clear()


class Recorder:
    """Wraps a backend and logs every call as the Java RecordedModel replays it.

    A row is stored sparsely: ``floor`` plus the entries that differ from it. That is lossless only
    when the wrapped backend's rows really are ``floor`` everywhere else (the scripted pair, or
    ``android_pair_vectors.TopNBackend``); ``forward`` checks that it is not asked to store a dense row.
    """

    def __init__(self, inner, tag: str, log: list, floor: np.float32 = FLOOR, max_entries: int | None = None) -> None:
        self.inner, self.tag, self.log = inner, tag, log
        self.floor, self.max_entries = np.float32(floor), max_entries
        self.name, self.vocab_size, self.max_seq_len = inner.name, inner.vocab_size, inner.max_seq_len

    @property
    def cached_len(self) -> int:
        return self.inner.cached_len

    def forward(self, token_ids, start_pos):
        rows = self.inner.forward(token_ids, start_pos)
        sparse = []
        for row in rows:
            idx = np.flatnonzero(row != self.floor)
            if self.max_entries is not None and len(idx) > self.max_entries:
                raise AssertionError(
                    f"{self.tag}: a row with {len(idx)} entries off the floor cannot be stored sparsely"
                )
            sparse.append({"i": idx.tolist(), "v": [_f32_json(x) for x in row[idx]]})
        self.log.append(
            {
                "m": self.tag,
                "op": "forward",
                "tokens": [int(t) for t in token_ids],
                "start": int(start_pos),
                "floor": float(self.floor),
                "rows": sparse,
            }
        )
        return rows

    def rollback(self, length):
        self.log.append({"m": self.tag, "op": "rollback", "length": int(length)})
        self.inner.rollback(length)

    def reset(self):
        self.log.append({"m": self.tag, "op": "reset"})
        self.inner.reset()


def _f32_json(x: np.float32) -> float:
    """The shortest decimal that reads back as the same float32 through a double (Java parses
    JSON numbers with Double.valueOf and narrows with a (float) cast; Python's float() then
    np.float32() do the same two roundings), else the exact double of the float32."""
    x = np.float32(x)
    short = float(np.format_float_positional(x, unique=True, trim="-"))
    return short if np.float32(short) == x else float(x)


class _RecordingGenerator:
    def __init__(self, inner: np.random.Generator, log: list[float]) -> None:
        self.inner, self.log = inner, log

    def random(self):
        u = float(self.inner.random())
        self.log.append(u)
        return u


# (name, prompt, continuation, config, cache setup) -- cache: None (fresh), "chain" (previous run's
# final cache), or {"capacity": n, "policy": p} for a bounded fresh cache.
_FOX3 = (
    " jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the"
    " lazy dog again."
)
RUNS = [
    (
        "greedy-ngram",
        "The quick brown fox",
        " jumps over the lazy dog. The quick brown fox jumps over the lazy dog again, and again.",
        dict(temperature=0.0, draft_len=4, mode="ngram", max_new_tokens=40),
        None,
    ),
    (
        "sample-ngram-chained",
        "The quick brown fox",
        " jumps over the lazy dog. The quick brown fox jumps over the lazy dog again, and again.",
        dict(temperature=1.0, draft_len=4, mode="ngram", max_new_tokens=40, seed=3),
        "chain",
    ),
    (
        "sample-dm",
        "def fibonacci(n):",
        "\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
        dict(temperature=0.7, draft_len=3, mode="dm", max_new_tokens=36, seed=5),
        None,
    ),
    (
        "greedy-target-only",
        "Natalia sold clips",
        " to 48 of her friends in April, and then she sold half as many clips in May.",
        dict(temperature=0.0, draft_len=4, mode="target-only", max_new_tokens=20),
        None,
    ),
    (
        "sample-ngram-lfu-capacity",
        "Natalia sold clips",
        " to 48 of her friends in April, and then she sold half as many clips in May. 48 / 2 = 24 clips.",
        dict(temperature=1.0, draft_len=5, mode="ngram", max_new_tokens=48, seed=11),
        {"capacity": 2, "policy": "lfu"},
    ),
    (
        "sample-ngram-lru-capacity",
        "Unicode:",
        " café naïve 日本語のテキスト 👍🏽 emoji and CJK 中文 mixed with ascii text.",
        dict(temperature=1.0, draft_len=4, mode="ngram", max_new_tokens=48, seed=17),
        {"capacity": 2, "policy": "lru"},
    ),
    (
        "greedy-ngram-warm",
        "The quick brown fox",
        _FOX3,
        dict(temperature=0.0, draft_len=4, mode="ngram", max_new_tokens=60),
        None,
    ),
    # Chained on the warm cache with a target that often disagrees: rejections land on merged n-grams (Eq. 2).
    (
        "sample-ngram-eq2",
        "The quick brown fox",
        _FOX3,
        dict(temperature=1.0, draft_len=5, mode="ngram", max_new_tokens=60, seed=3, target_slip=0.35),
        "chain",
    ),
    (
        "greedy-ngram-unicode",
        "Unicode:",
        " café naïve 日本語のテキスト 👍🏽 emoji and CJK 中文 mixed with ascii text.",
        dict(temperature=0.0, draft_len=6, mode="ngram", max_new_tokens=40),
        None,
    ),
    # Drafts copied from the context where the script repeats (runtime/context_lookup.py), greedy and sampled
    # (q' = 1 per copied token; a target that often disagrees rejects some of them).
    (
        "greedy-ngram-lookup",
        "The quick brown fox",
        _FOX3,
        dict(temperature=0.0, draft_len=3, mode="ngram", max_new_tokens=60, lookup=LookupConfig(5, 2, 4)),
        None,
    ),
    (
        "sample-dm-lookup",
        "The quick brown fox",
        _FOX3,
        dict(
            temperature=0.6,
            draft_len=3,
            mode="dm",
            max_new_tokens=60,
            seed=29,
            target_slip=0.1,
            lookup=LookupConfig(4, 1, 3),
        ),
        None,
    ),
    (
        "sample-ngram-hot",
        "for i in range(10):",
        "\n    total += i * i\nprint(total)  # sum of squares\n",
        dict(temperature=1.3, draft_len=4, mode="ngram", max_new_tokens=32, seed=23, lookbehind=4),
        None,
    ),
]


def _loaded(backend, codec: TokenCodec, eos_ids=None) -> LoadedModel:
    eos = frozenset(codec.eos_ids if eos_ids is None else eos_ids)
    return LoadedModel(backend, codec, eos, Path("."), "scripted")


def open_cache(
    cache_setup,
    previous: NgramCache | None,
    drafter_codec: TokenCodec,
    target_codec: TokenCodec,
    drafter_width: int,
    target_width: int,
) -> tuple[NgramCache, str | None]:
    """The run's starting cache: fresh, bounded, or the previous run's (through its file, as the app
    does between sessions). Returns the cache and the file text the Java replay loads (or None)."""
    args = (drafter_codec.sha256, target_codec.sha256, drafter_width)
    if cache_setup == "chain" and previous is not None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "cache.json"
            previous.save(path)
            return NgramCache.load(path, *args, target_width), path.read_bytes().decode()
    if isinstance(cache_setup, dict):
        return NgramCache(*args, capacity=cache_setup["capacity"], policy=cache_setup["policy"]), None
    return NgramCache(*args), None


def record_run(
    name: str,
    prompt: str,
    cfg_kw: dict,
    drafter,
    target,
    drafter_codec: TokenCodec,
    target_codec: TokenCodec,
    cache: NgramCache,
    cache_file: str | None,
    log: list,
    target_eos=None,
) -> dict:
    """One traced ``SpeculativeDecoder.generate`` through two ``Recorder`` backends sharing ``log``,
    as the run record the Java replay reads."""
    uniforms: list[float] = []
    cache_before = cache._serialise().decode()
    target_loaded = _loaded(target, target_codec, target_eos)
    dec = SpeculativeDecoder(target_loaded, _loaded(drafter, drafter_codec), cache)
    # The Java core translates and samples as the paper does (direct map + n-grams, Eq. 1-2); it has
    # no splits and no exact n-gram sampling yet.
    cfg = DecodeConfig(**{"splits": False, "ngram_sampling": "paper", **cfg_kw})
    rng = _RecordingGenerator(np.random.default_rng(cfg.seed), uniforms)
    result = dec.generate(prompt, cfg, trace=True, rng=rng)
    return {
        # ``accept_offsets`` is the online controller's (runtime/draft_length/controller.py); the Java
        # core always drafts with a fixed K and samples n-grams by Eq. 1-2, so the record keeps the
        # fields it reads.
        "name": name,
        "prompt": prompt,
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("accept_offsets", "ngram_sampling")},
        "target_eos": sorted(target_loaded.eos_ids),
        "drafter_width": drafter.vocab_size,
        "target_width": target.vocab_size,
        "max_seq_len": {"drafter": drafter.max_seq_len, "target": target.max_seq_len},
        "cache_file": cache_file,
        "cache_before": cache_before,
        "calls": log,
        "uniforms": uniforms,
        "rounds": [
            _jsonable({k: v for k, v in asdict(r).items() if k not in RoundTrace.TIMING}) for r in result.rounds
        ],
        "token_ids": [int(t) for t in result.token_ids],
        "text": result.text,
        "stats": {k: v for k, v in asdict(result.stats).items() if not k.endswith("seconds")},
        "cache_after": cache._serialise().decode(),
    }


def loop_vectors(drafter_codec: TokenCodec, target_codec: TokenCodec) -> dict:
    runs = []
    previous_cache: NgramCache | None = None
    for name, prompt, cont, cfg_kw, cache_setup in RUNS:
        cfg_kw = dict(cfg_kw)
        script = prompt + cont
        log: list = []
        d_eos = min(drafter_codec.eos_ids)
        t_eos = min(target_codec.eos_ids)
        drafter = Recorder(ScriptedModel(drafter_codec, script, d_eos, "drafter:" + name, slip=0.12), "drafter", log)
        slip = cfg_kw.pop("target_slip", 0.02)  # how often the target confidently disagrees with the script
        target = Recorder(ScriptedModel(target_codec, script, t_eos, "target:" + name, slip=slip), "target", log)
        cache, cache_file = open_cache(
            cache_setup, previous_cache, drafter_codec, target_codec, drafter.vocab_size, target.vocab_size
        )
        runs.append(
            record_run(name, prompt, cfg_kw, drafter, target, drafter_codec, target_codec, cache, cache_file, log)
        )
        previous_cache = cache
    return {
        "drafter_tokenizer": drafter_codec.sha256,
        "target_tokenizer": target_codec.sha256,
        "floor": float(FLOOR),
        "runs": runs,
    }


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def qprime_vectors(drafter_codec: TokenCodec, target_codec: TokenCodec, seed: int = 0) -> list[dict]:
    """Eq. 1 / Eq. 2 on real vocabularies: drafts that translate to merged n-grams whose prefix
    sub-token is direct-mapped, random proposal rows, and q'(t_j) plus the whole q' row per position."""
    from omnidraft.runtime.translate import proposal_prob, q_prime_full, translate
    from omnidraft.runtime.vocab import build_vocab_map

    vocab = build_vocab_map(drafter_codec, target_codec)
    cache = NgramCache(drafter_codec.sha256, target_codec.sha256, drafter_codec.vocab_size)
    rng = np.random.default_rng(seed)
    cases = []
    words = [" flake", " Brewers", " foreclosure", " jumps", " lazy", " fibonacci", " squares", " naïve"]
    for w in words:
        key = tuple(drafter_codec.encode_continuation(w) or ())
        tid = target_codec.encode_continuation(w)
        if len(key) < 2 or not tid or len(tid) != 1 or vocab.d2t[key[0]] < 0:
            continue
        cache.observe(key, tid[0])
        lead = [int(vocab.drafter_ids[rng.integers(vocab.size)])]
        draft = lead + list(key)
        q_rows = []
        for d in draft:
            support = set(rng.choice(vocab.drafter_ids, 6, replace=False).tolist()) | {d, key[0]}
            q = np.zeros(drafter_codec.vocab_size)
            for s in sorted(support):
                q[s] = rng.random() + (2.0 if s == d else 0.0)
            q_rows.append(q / q.sum())
        tr = translate(draft, vocab, cache)
        per_pos = []
        for j in range(len(tr)):
            full = q_prime_full(j, tr, draft, q_rows, vocab, target_codec.vocab_size)
            nz = np.flatnonzero(full)
            per_pos.append(
                {
                    "q_prime": proposal_prob(j, tr, draft, q_rows, vocab),
                    "full_i": nz.tolist(),
                    "full_v": full[nz].tolist(),
                }
            )
        cases.append(
            {
                "word": w,
                "key": list(key),
                "target": tid[0],
                "draft": draft,
                "q_rows": [{"i": np.flatnonzero(q).tolist(), "v": q[np.flatnonzero(q)].tolist()} for q in q_rows],
                "target_ids": list(tr.target_ids),
                "merged": [k is not None for k in tr.keys],
                "positions": per_pos,
            }
        )
    return cases
