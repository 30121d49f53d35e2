"""Who sees what: non-IID shards of the train streams, the held-out test prompts, the probe set.

Client ``i`` draws mostly from stream ``i mod S``; odd clients also see the next stream in one
prompt of four. The streams a client never draws from are its *unseen* streams, on which its local
drafter is compared with the global one. Shards are disjoint (client ``i`` takes the stream's
prompts ``i, i + N, i + 2N, ...``); the probe set is the end of each train stream, past every shard.
"""

from __future__ import annotations

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
    pools = {s: load_prompts(s, "train", None, target=target) for s in set(plan)}
    out = []
    for s in plan:
        out.append(pools[s][(index + clients * used[s]) % len(pools[s])])
        used[s] += 1
    return out


def test_prompts(streams: tuple[str, ...], per_stream: int, target: Path) -> dict[str, list[str]]:
    return {s: load_prompts(s, "test", per_stream, target=target) for s in streams}


def probe_prompts(streams: tuple[str, ...], per_stream: int, target: Path) -> list[str]:
    return [p for s in streams for p in load_prompts(s, "train", None, target=target)[-per_stream:]]
