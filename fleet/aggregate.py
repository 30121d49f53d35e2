"""Server-side arithmetic on LoRA adapters: checks, FedAvg, Krum, the A/B-vs-BA gap, DP noise.

Adapters are PEFT state dicts (``...lora_A.weight`` [r, in], ``...lora_B.weight`` [out, r]); the
update of a layer is ``s * B @ A``. Nothing here imports Flower: the strategy feeds it tensors.
"""

from __future__ import annotations

import math

import torch

Adapter = dict[str, torch.Tensor]


def check_adapter(adapter: Adapter, reference: Adapter) -> str | None:
    """Why ``adapter`` cannot be averaged with ``reference`` (names, shapes, finiteness), or None."""
    missing = sorted(set(reference) - set(adapter))
    extra = sorted(set(adapter) - set(reference))
    if missing or extra:
        name = (missing or extra)[0]
        return f"{len(missing)} tensors missing and {len(extra)} unexpected (first: {name})"
    for name, ref in reference.items():
        t = adapter[name]
        if tuple(t.shape) != tuple(ref.shape):
            return f"tensor {name} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}"
        if not torch.isfinite(t).all():
            return f"tensor {name} holds NaN or infinite values"
    return None


def fedavg(adapters: list[Adapter], weights: list[float]) -> Adapter:
    """Weighted mean of each tensor: A and B are averaged separately (see the package docstring)."""
    if not adapters:
        raise ValueError("nothing to average")
    total = float(sum(weights))
    if not total > 0:
        weights, total = [1.0] * len(adapters), float(len(adapters))
    return {
        name: sum(a[name].double() * (w / total) for a, w in zip(adapters, weights)).to(adapters[0][name].dtype)
        for name in adapters[0]
    }


def lora_pairs(adapter: Adapter) -> list[tuple[str, str]]:
    return [(a, a.replace("lora_A", "lora_B")) for a in sorted(adapter) if "lora_A" in a]


def merged_gap(adapters: list[Adapter], weights: list[float]) -> float:
    """||B_avg A_avg - sum_i w_i B_i A_i||_F / ||sum_i w_i B_i A_i||_F over all layers: how far
    averaging the factors lands from averaging the layer updates themselves."""
    avg = fedavg(adapters, weights)
    total = float(sum(weights)) or float(len(adapters))
    num = den = 0.0
    for a, b in lora_pairs(avg):
        exact = sum(x[b].double() @ x[a].double() * (w / total) for x, w in zip(adapters, weights))
        num += float(((avg[b].double() @ avg[a].double()) - exact).pow(2).sum())
        den += float(exact.pow(2).sum())
    return math.sqrt(num / den) if den > 0 else 0.0


def flat(adapter: Adapter, minus: Adapter | None = None) -> torch.Tensor:
    parts = [(adapter[n] - minus[n]) if minus is not None else adapter[n] for n in sorted(adapter)]
    return torch.cat([p.reshape(-1).double() for p in parts])


def krum_scores(vectors: list[torch.Tensor], byzantine: int) -> list[float]:
    """Krum (Blanchard et al., 2017): each update's summed squared distance to its n - f - 2
    nearest others; a poisoned update far from the honest cluster scores high."""
    n = len(vectors)
    stacked = torch.stack(vectors)
    d = torch.cdist(stacked, stacked).pow(2)
    k = max(1, n - byzantine - 2)
    scores = []
    for i in range(n):
        others = torch.cat([d[i, :i], d[i, i + 1 :]])
        scores.append(float(others.sort().values[: min(k, len(others))].sum()) if len(others) else 0.0)
    return scores


def krum_keep(vectors: list[torch.Tensor], byzantine: int) -> list[int]:
    """Multi-Krum's selection: the n - f updates with the lowest scores (all of them when n <= 2)."""
    n = len(vectors)
    if n <= 2:
        return list(range(n))
    scores = krum_scores(vectors, byzantine)
    order = sorted(range(n), key=lambda i: scores[i])
    return sorted(order[: max(1, n - byzantine)])


def add_dp_noise(adapter: Adapter, *, previous: Adapter, std: float, generator: torch.Generator) -> Adapter:
    """Gaussian noise on the round's aggregate change, scaled to each tensor's change norm (a
    utility knob: without per-client clipping this is not a formal DP guarantee)."""
    if std <= 0:
        return adapter
    out = {}
    for name, t in adapter.items():
        change = t - previous[name]
        scale = std * float(change.norm()) / math.sqrt(change.numel())
        out[name] = t + torch.randn(t.shape, generator=generator, dtype=t.dtype) * scale
    return out
