"""A fleet run's settings as nested data: what each device does locally, how the server aggregates,
and how the report measures. The server sends the whole object to every client in each round's
message (one JSON string), so simulation and deployment run the same ClientApp with no side files."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields

from omnidraft.errors import InvalidArgument
from omnidraft.models.streams import STREAMS

FILTERS = ("probe", "krum", "none")
EXPORTS = ("onnx", "executorch")


@dataclass
class LocalConfig:
    """One device's online pass per round (the `omnidraft adapt` loop, drift guard on)."""

    prompts_per_round: int = 4
    max_new_tokens: int = 24
    draft_len: int = 4
    rank: int = 8
    lr: float = 1e-3  # at 2e-3 the global drafter peaked after two rounds and lost half its gain (README)
    local_steps: int = 4  # AdamW steps on each update's batch (FedAvg's local epochs)
    engine: str = "executorch"
    seq_len: int = 160  # one fixed training-program shape: longer contexts keep their last tokens
    guard_window: int = 4
    guard_margin: float = 0.02


@dataclass
class ServerConfig:
    """Aggregation: FedAvg weighted by verified tokens, after dropping deltas that fail the checks."""

    filter: str = "probe"  # probe: drop a delta that lowers the probe set's agreement; krum: keep Krum's picks
    probe_prompts: int = 16  # per stream, from the train split past every client's shard
    # Honest deltas alone scored within 0.04 of each other in a round, poisoned ones 0.75 lower (README).
    probe_margin: float = 0.05
    krum_byzantine: int = 1  # f in Krum's score (n - f - 2 nearest neighbours)
    guard: bool = True  # publish an aggregate only if its probe-prompt acceptance beats the published one's
    guard_margin: float = 0.0  # > 0 lets an aggregate through that falls short by less than this
    dp_noise: float = 0.0  # Gaussian noise (std, relative to the aggregate's norm per tensor); 0 = off
    timeout_s: float = 900.0  # a client that has not answered by then is left out of the round


@dataclass
class EvalConfig:
    prompts_per_stream: int = 12  # held-out (test split) prompts per stream: 6 left the curve to noise
    greedy_check: int = 3  # held-out prompts decoded target-only and with the final global drafter


@dataclass
class FleetConfig:
    pair: str = "tiny"
    streams: tuple[str, ...] = STREAMS
    clients: int = 8
    rounds: int = 5
    poisoned: tuple[int, ...] = ()  # partition ids whose deltas are trained on random targets
    exports: tuple[str, ...] = ()  # formats the final global drafter is re-lowered to: onnx, executorch
    seed: int = 0
    local: LocalConfig = field(default_factory=LocalConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def validate(self) -> FleetConfig:
        for name, lo in (("clients", 1), ("rounds", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InvalidArgument(f"--{name} must be an integer >= {lo} (got {v})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise InvalidArgument(f"--seed must be an integer >= 0 (got {self.seed})")
        if not self.streams:
            raise InvalidArgument(f"--streams is empty; pass some of {','.join(STREAMS)}")
        bad = [s for s in self.streams if s not in STREAMS]
        if bad:
            raise InvalidArgument(f"unknown stream {bad[0]!r} in --streams; use some of {','.join(STREAMS)}")
        bad = [f for f in self.exports if f not in EXPORTS]
        if bad:
            raise InvalidArgument(f"unknown --export format {bad[0]!r}; use {', '.join(EXPORTS)}")
        out = [p for p in self.poisoned if not 0 <= p < self.clients]
        if out:
            raise InvalidArgument(f"--poison-clients {out[0]} is not a client id in 0..{self.clients - 1}")
        if self.server.filter not in FILTERS:
            raise InvalidArgument(f"unknown --filter {self.server.filter!r}; use {', '.join(FILTERS)}")
        for section in (self.local, self.server, self.eval):
            for f in fields(section):
                v = getattr(section, f.name)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
                    raise InvalidArgument(f"--{f.name.replace('_', '-')} must be a finite number (got {v})")
        positive = (
            ("prompts-per-round", self.local.prompts_per_round),
            ("max-new-tokens", self.local.max_new_tokens),
            ("draft-len", self.local.draft_len),
            ("lora-rank", self.local.rank),
            ("local-steps", self.local.local_steps),
            ("eval-prompts", self.eval.prompts_per_stream),
            ("probe-prompts", self.server.probe_prompts),
        )
        for name, v in positive:
            if v < 1:
                raise InvalidArgument(f"--{name} must be >= 1 (got {v})")
        if not self.local.lr > 0:
            raise InvalidArgument(f"--lr must be > 0 (got {self.local.lr})")
        if self.eval.greedy_check < 0:
            raise InvalidArgument(f"--greedy-check must be >= 0 (got {self.eval.greedy_check})")
        if self.server.dp_noise < 0 or self.server.probe_margin < 0 or self.server.timeout_s <= 0:
            raise InvalidArgument("--dp-noise and --probe-margin must be >= 0, --timeout > 0")
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FleetConfig:
        try:
            d = json.loads(text)
            return cls(
                **{
                    **d,
                    "streams": tuple(d["streams"]),
                    "poisoned": tuple(d["poisoned"]),
                    "exports": tuple(d["exports"]),
                    "local": LocalConfig(**d["local"]),
                    "server": ServerConfig(**d["server"]),
                    "eval": EvalConfig(**d["eval"]),
                }
            ).validate()
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument(f"the server sent a fleet configuration this client cannot read ({exc})") from None
