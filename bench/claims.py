"""The issue's "must show" statements and the paper's qualitative ordering, checked against the
measured report (each check cites the values it compared; a check without data says so)."""

from __future__ import annotations

from pathlib import Path

from omnidraft.bench.settings import LOOKUP

# The bar for the best adapted row's wall-clock speedup, by target and stream. A real 0.5B target on a
# CPU leaves the drafter a cost ratio near the paper's 32B setting, hence its higher bars; the tiny pair
# (and any target not named here) keeps 1.3x on code and math. Keyed by the target's folder name, the
# name `omnidraft models install` gives it.
SPEEDUP_BARS = {
    "qwen2.5-coder-0.5b-instruct": {"code": 2.0, "math": 1.5},
    "gemma-3-270m": {"text": 1.5},
}
DEFAULT_BARS = {"code": 1.3, "math": 1.3}
ADAPTED = ("l-dm", "hybrid", "hybrid+lora", "hybrid+adaptive")  # rows measured after the adaptation pass
# omnidraft's own peer rows: its best method replayed on a backend, each timed in the peers' group
OWN_PEERS = ("omnidraft-torch", "omnidraft-ort", "omnidraft-executorch")


def _ok(rows: list[dict], stream: str, method: str) -> dict | None:
    return next((r for r in rows if r["stream"] == stream and r["method"] == method and r.get("status") == "ok"), None)


def _check(claim: str, stream: str | None, holds: bool | None, **values) -> dict:
    return {"claim": claim, "stream": stream, "holds": holds, "values": values}


def ordering(report: dict) -> list[dict]:
    rows, out = report["rows"], []
    for stream in dict.fromkeys(r["stream"] for r in rows):
        dm, ng = _ok(rows, stream, "spd-dm"), _ok(rows, stream, "spd-dm+ngram_pp") or _ok(rows, stream, "spd-dm+ngram")
        if dm and ng:
            out.append(
                _check(
                    "the cache helps the untrained drafter (acceptance)",
                    stream,
                    ng["acceptance_rate"] > dm["acceptance_rate"],
                    **{"spd-dm": dm["acceptance_rate"], ng["method"]: ng["acceptance_rate"]},
                )
            )
        chain = [(m, _ok(rows, stream, m)) for m in ("spd-dm", "l-dm", "hybrid")]
        present = [(m, r) for m, r in chain if r]
        # Acceptance is per proposed target token; a split proposes several at once and is often
        # accepted only in part, so the same ordering is also checked on tokens per target call.
        # Each adapted row runs at its own best K, and acceptance falls as K grows: it is compared only
        # where the rows share K. Speedup is what the best K maximises.
        ks = {m: r.get("draft_len") for m, r in present}
        for field, label in (
            ("acceptance_rate", "acceptance"),
            ("tokens_per_step", "tokens per target call"),
            ("speedup", "speedup"),
        ):
            claim = f"hybrid >= L_DM >= untrained ({label})"
            if len(present) >= 2:
                vals = [r[field] for _, r in present]
                if field == "acceptance_rate" and len(set(ks.values())) > 1:
                    out.append(
                        _check(
                            claim,
                            stream,
                            None,
                            note="the rows run at different K",
                            **{m: r[field] for m, r in present},
                            draft_len=ks,
                        )
                    )
                    continue
                out.append(
                    _check(
                        claim, stream, all(a <= b for a, b in zip(vals, vals[1:])), **{m: r[field] for m, r in present}
                    )
                )
            else:
                out.append(_check(claim, stream, None, note="adapted rows not measured"))
    return out


def speedup_bars(report: dict) -> dict[str, float]:
    """The streams whose adapted speedup the issue sets a bar for, and the bar, for this report's target."""
    target = ((report.get("meta") or {}).get("pair") or {}).get("target")
    return SPEEDUP_BARS.get(Path(target).name, DEFAULT_BARS) if target else DEFAULT_BARS


def must_show(report: dict) -> list[dict]:
    rows, peers, out = report["rows"], report["peers"], []
    bars = speedup_bars(report)
    for stream in dict.fromkeys(r["stream"] for r in rows):
        # "Best setting": the fastest adapted row (a fixed preference order once picked a slower one),
        # context lookup included: its twin decodes with the same adapted drafter.
        adapted = (*ADAPTED, *(m + LOOKUP for m in ADAPTED))
        best = max((r for m in adapted if (r := _ok(rows, stream, m))), key=lambda r: r["speedup"], default=None)
        if stream in bars:
            out.append(
                _check(
                    f"adapted wall-clock speedup >= {bars[stream]}x, identical output",
                    stream,
                    best["speedup"] >= bars[stream] and best.get("outputs_match_target_only") is True if best else None,
                    **(
                        {
                            "method": best["method"],
                            "speedup": best["speedup"],
                            "decode_speedup": best.get("decode_speedup"),
                            "bound": best["bound"],
                            "outputs_match_target_only": best.get("outputs_match_target_only"),
                        }
                        if best
                        else {"note": "no adapted row measured"}
                    ),
                )
            )
        by = {p["name"]: p for p in peers if p["stream"] == stream}
        out += _against_llamacpp(stream, by)
        ours, uag = by.get("omnidraft-ort"), by.get("hf-assisted-uag")
        if ours and uag and ours.get("status", "ok") == "ok":
            ratio = ours["tokens_per_s"] / uag["tokens_per_s"] if uag["tokens_per_s"] else None
            out.append(
                _check(
                    "omnidraft-ort >= 1.5x HF assisted generation (UAG), identical greedy output",
                    stream,
                    bool(ratio and ratio >= 1.5 and ours["outputs_match_target_only"]),
                    method=ours.get("method"),
                    ratio=round(ratio, 3) if ratio else None,
                    outputs_match_target_only=ours["outputs_match_target_only"],
                )
            )
    return out


def _against_llamacpp(stream: str, by: dict[str, dict]) -> list[dict]:
    """omnidraft's fastest backend against llama.cpp on the same GGUF, all timed in one peers group:
    >= 1.5x its target-only, and faster than its prompt lookup."""
    own = [p for n, p in by.items() if n in OWN_PEERS and p.get("status", "ok") == "ok"]
    if not own:
        return []
    ours = max(own, key=lambda p: p["tokens_per_s"])
    values = {"omnidraft": ours["name"], "method": ours.get("method"), "tokens_per_s": ours["tokens_per_s"]}
    out = []
    for peer, claim, holds in (
        ("llama.cpp-target-only", "omnidraft's best backend >= 1.5x llama.cpp target-only", lambda r: r >= 1.5),
        ("llama.cpp-prompt-lookup", "omnidraft's best backend faster than llama.cpp prompt lookup", lambda r: r > 1.0),
    ):
        p = by.get(peer)
        if p is None or p.get("status", "ok") != "ok" or not p.get("tokens_per_s"):
            continue  # not installed or failed: its row says why
        ratio = ours["tokens_per_s"] / p["tokens_per_s"]
        out.append(_check(claim, stream, holds(ratio), **values, **{peer: p["tokens_per_s"]}, ratio=round(ratio, 3)))
    return out
