"""Who sees what: non-IID shards of the train streams, the held-out test prompts, the probe set.

Client ``i`` draws mostly from stream ``i mod S``; odd clients also see the next stream in one
prompt of four. The streams a client never draws from are its *unseen* streams, on which its local
drafter is compared with the global one.

Each split lists its sources one after another (HumanEval before the stdlib functions, literature
before documentation prose), so every draw here is spread over the whole split: shards and the probe
set come from one fixed shuffle of each train stream, the held-out prompts are evenly spaced over the
test split. A probe set cut from the raw end of the train split would hold only stdlib code and
documentation prose while the devices learn and the held-out prompts measure every source, and the
server's guard would then judge aggregates on prompts unlike the ones they are scored on. Shards are
disjoint (client ``i`` takes the shuffled stream's prompts ``i, i + N, i + 2N, ...``); the probe set
is the end of each shuffled stream, past every shard.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

from omnidraft.adapt.run import load_prompts

SECONDARY_EVERY = 4  # an odd client's every 4th prompt comes from its secondary stream


def client_streams(index: int, streams: tuple[str, ...]) -> list[str]:
    """The streams client ``index`` draws from (primary first)."""
    primary = streams[index % len(streams)]
    if index % 2 and len(streams) > 1:
        return [primary, streams[(index + 1) % len(streams)]]
    return [primary]


def unseen_streams(index: int, streams: tuple[str, ...]) -> list[str]:
    seen = client_streams(index, streams)
    return [s for s in streams if s not in seen]


@functools.cache
def _train_pool(stream: str, target: Path | None) -> tuple[str, ...]:
    """The stream's train prompts in one fixed order, the same on the server and every device."""
    items = load_prompts(stream, "train", None, target=target)
    random.Random(f"fleet-{stream}").shuffle(items)
    return tuple(items)


def client_prompts(
    *, index: int, clients: int, streams: tuple[str, ...], round_: int, per_round: int, target: Path
) -> list[str]:
    """Client ``index``'s prompts for round ``round_`` (1-based): the next ``per_round`` of its shard."""
    mine = client_streams(index, streams)
    plan = [
        mine[1] if len(mine) > 1 and (j + 1) % SECONDARY_EVERY == 0 else mine[0]
        for j in range((round_ - 1) * per_round, round_ * per_round)
    ]
    # How many prompts of each stream this client used in earlier rounds: its position in the shard.
    used = {s: 0 for s in mine}
    for j in range((round_ - 1) * per_round):
        used[mine[1] if len(mine) > 1 and (j + 1) % SECONDARY_EVERY == 0 else mine[0]] += 1
    out = []
    for s in plan:
        pool = _train_pool(s, target)
        out.append(pool[(index + clients * used[s]) % len(pool)])
        used[s] += 1
    return out


def test_prompts(streams: tuple[str, ...], per_stream: int, target: Path) -> dict[str, list[str]]:
    """``per_stream`` held-out prompts of each stream, evenly spaced over its test split."""
    out = {}
    for s in streams:
        items = load_prompts(s, "test", None, target=target)
        n = min(per_stream, len(items))
        out[s] = [items[j * len(items) // n] for j in range(n)]
    return out


def probe_prompts(streams: tuple[str, ...], per_stream: int, target: Path) -> list[str]:
    return [p for s in streams for p in _train_pool(s, target)[-per_stream:]]
