"""`omnidraft bench`'s settings: one run's options, and their validation before any model loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omnidraft.bench import adapted_rows
from omnidraft.bench.bundled import DRAFT_VOCAB
from omnidraft.bench.demo import BACKENDS
from omnidraft.errors import InvalidArgument
from omnidraft.models.streams import STREAMS
from omnidraft.runtime.context_lookup import LookupConfig

PEER_GROUPS = ("hf", "torch", "ort", "executorch", "llama.cpp", "ort-genai")
# A row named METHOD + LOOKUP decodes as METHOD's row does (drafter, K, starting cache) with the context
# lookup on: the paper's rows stay the paper's method, and the lookup's gain is one row apart.
LOOKUP = "+lookup"


@dataclass
class BenchSettings:
    pair: str = "bundled"
    streams: tuple[str, ...] = STREAMS
    backend: str = "ort"
    prompts: int = 12  # held-out test prompts per stream (every row uses the same ones)
    max_new_tokens: int = 48
    # K = 1 included: a small target verifies 2 tokens for about the cost of 1 (omnidraft bench-export
    # shows it), so K = 1 is often the fastest fixed K at moderate acceptance.
    sweep_ks: tuple[int, ...] = (1, 2, 3, 4, 6)
    sweep_prompts: int = 8  # train prompts for choosing the fixed K (never test prompts; 3 picked K = 3
    # for text's hybrid drafter, whose K = 1 ran faster on the test prompts)
    train_prompts: int = 24  # train prompts that pre-collect the cache of spd-dm+ngram_pp
    # hybrid+adaptive: train prompts its gamma controller is tuned on before the timed row, as the fixed
    # K rows pick K on train prompts. 16: enough windows (2 prompts each) for it to turn drafting off.
    tune_prompts: int = 16
    adapt_prompts: int = 64  # train prompts of each adaptation pass (adapted rows; 0 skips them)
    # lr of every adapted row (None: bench/adapted_rows.py's short_pass_lr, which depends on the drafter:
    # 1e-3 lifts an untrained one, 1e-4 keeps improving one already trained against the real targets).
    adapt_lr: float | None = None
    # adapted rows to run. A full pass costs each row differently: hybrid+lora's LoRA steps run
    # ExecuTorch's training program, which dominates its time and makes it several times slower than
    # the eager full fine-tuning of l-dm and hybrid.
    adapted: tuple[str, ...] | None = None  # None: all of bench/adapted_rows.py's METHODS
    peers: tuple[str, ...] = PEER_GROUPS
    eviction: bool = True
    verify_repeats: int = 20  # calls per k of the verify cost curve (bench/verify_cost.py; 0 skips it)
    max_seq_len: int = 512  # exported KV-cache length for ort / executorch
    threads: int | None = 1  # intra-op threads of every engine (None: each library's default)
    gamma: float = 0.5  # hybrid+adaptive: initial stopping threshold (tuned online from there)
    splits: bool = True  # greedy ngram rows may propose split drafter tokens (False: the paper's translation)
    lookup: LookupConfig | None = field(default_factory=LookupConfig)  # the +lookup rows' (None: none run)
    draft_vocab: int | None = DRAFT_VOCAB  # drafter exports keep this many tokens (None: all; bench/bundled.py)
    target_quant: str | None = None  # the main backend's target export (None: the backend's own, ort int8)
    quick: bool = False
    out: Path = Path("reports/bench")

    @classmethod
    def quick_settings(cls, backend: str = "ort", **kw) -> BenchSettings:
        peers = tuple(dict.fromkeys(("hf", backend)))
        return cls(
            backend=backend,
            prompts=2,
            max_new_tokens=24,
            sweep_ks=(2, 4),
            sweep_prompts=1,
            train_prompts=2,
            adapt_prompts=0,
            peers=peers,
            eviction=False,
            verify_repeats=3,
            quick=True,
            **kw,
        )


def validate(s: BenchSettings) -> None:
    """Reject bad options before any model is loaded, naming the valid choices."""
    if s.backend not in BACKENDS:
        raise InvalidArgument(f"unknown backend {s.backend!r}; choose one of {', '.join(BACKENDS)}")
    bad = [x for x in s.streams if x not in STREAMS]
    if bad or not s.streams:
        raise InvalidArgument(f"unknown stream {', '.join(bad) or '(none given)'}; choose from {', '.join(STREAMS)}")
    bad = [x for x in s.peers if x not in PEER_GROUPS]
    if bad:
        raise InvalidArgument(f"unknown peer {', '.join(bad)}; choose from {', '.join(PEER_GROUPS)} (or 'none')")
    bad = [x for x in s.adapted or () if x not in adapted_rows.METHODS]
    if bad:
        raise InvalidArgument(
            f"unknown adapted row {', '.join(bad)}; choose from {', '.join(adapted_rows.METHODS)} (or 'none')"
        )
    if s.tune_prompts < 0:
        raise InvalidArgument(f"--tune-prompts must be >= 0 (got {s.tune_prompts}); 0 starts hybrid+adaptive untuned")
    for name in ("prompts", "max_new_tokens", "sweep_prompts", "max_seq_len"):
        if getattr(s, name) < 1:
            raise InvalidArgument(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(s, name)})")
    if not 0.05 <= s.gamma <= 0.95:
        raise InvalidArgument(f"--gamma must be within [0.05, 0.95] for the tuned hybrid+adaptive row (got {s.gamma})")
    if s.adapt_lr is not None and not 0 < s.adapt_lr < 1:
        raise InvalidArgument(f"--adapt-lr must be within (0, 1) (got {s.adapt_lr}); omit it for the short-pass lr")
    if s.draft_vocab is not None and s.draft_vocab < 0:
        raise InvalidArgument(f"--draft-vocab must be >= 0 (got {s.draft_vocab}); 0 keeps every drafter token")
    if s.threads is not None and s.threads < 1:
        raise InvalidArgument(f"--threads must be >= 1 (got {s.threads}); omit it for one thread")
    if s.target_quant is not None:
        from omnidraft.export.recipes import QUANTS

        fmt = BACKENDS[s.backend][0]
        if fmt is None or s.target_quant not in QUANTS[fmt]:
            raise InvalidArgument(
                f"--target-quant {s.target_quant} does not apply to the {s.backend} backend"
                + (f"; choose one of {', '.join(QUANTS[fmt])}" if fmt else " (it runs the HF folders as they are)")
            )
    if s.lookup is not None:
        s.lookup.validate()
    if s.verify_repeats < 0:
        raise InvalidArgument(f"--verify-repeats must be >= 0 (got {s.verify_repeats}); 0 skips the verify cost curve")
    if s.train_prompts < 0 or s.adapt_prompts < 0 or not s.sweep_ks or min(s.sweep_ks) < 1:
        raise InvalidArgument("--train-prompts must be >= 0 and every K in the sweep >= 1")
