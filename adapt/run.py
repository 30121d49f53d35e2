"""One adaptation run end to end (used by `omnidraft adapt` and the demo): held-out acceptance
before, one pass over the stream with guarded publishes, held-out acceptance after, report."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omnidraft.atomic import check_writable
from omnidraft.errors import InvalidArgument

from . import report as reporting
from .config import AdaptConfig
from .online import OnlineAdapter


def load_prompts(stream: str, split: str, limit: int | None, *, target: Path | None = None) -> list[str]:
    """Stream prompts as ``target`` reads them (wrapped in its chat template where it has one)."""
    from omnidraft.models import streams

    if stream in streams.STREAMS:
        items = streams.load_stream(stream, split)
    elif Path(stream).suffix or Path(stream).exists():
        if split != "train":
            return []  # a user file has no held-out split
        items = streams.load_stream_file(stream)
    else:
        raise InvalidArgument(
            f"unknown stream {stream!r}; use one of {', '.join(streams.STREAMS)} or a JSONL file path"
        )
    if limit is not None:
        if limit < 1:
            raise InvalidArgument(f"prompt limits must be >= 1 (got {limit})")
        items = items[:limit]
    if target is not None:
        items = streams.for_target(items, target)
    return [p.prompt for p in items]


def _by_draft_len(
    ad: OnlineAdapter, test: list[str], final_cache, draft_lens: tuple[int, ...], progress: bool
) -> dict[str, dict]:
    out = {}
    with _bar(3 * len(draft_lens) * len(test), "eval per K", progress) as bar:
        for k in draft_lens:
            row = {}
            for key, weights, cache in (
                ("before", ad.initial, ad.initial_cache),
                ("cache_only", ad.initial, final_cache),
                ("after", ad.published, final_cache),
            ):
                row[key] = ad.evaluate(test, weights, cache, progress=lambda m: bar.update(1), draft_len=k).summary()
            out[str(k)] = row
    return out


def _bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, disable=not enabled, dynamic_ncols=True)


def adapt_stream(
    drafter: Path,
    target: Path,
    stream: str,
    out: Path,
    cfg: AdaptConfig,
    state: Path | None = None,
    train_limit: int | None = None,
    eval_split: str | None = "test",
    eval_limit: int | None = None,
    greedy_check: int = 8,
    progress: bool = True,
    eval_draft_lens: tuple[int, ...] = (),
) -> dict:
    """``eval_draft_lens``: also measure held-out acceptance before/after at each of these fixed K
    (acceptance per proposed token falls with K, so a lift is only comparable at the same K)."""
    t_start = time.perf_counter()
    cfg.validate()  # bad options fail before any stream or model is read
    check_writable(out, folder=True)  # an unwritable --out or --state is refused now, not after the work
    check_writable(state or out / "state", folder=True)
    bad = [k for k in eval_draft_lens if k < 1]
    if bad:
        raise InvalidArgument(f"--eval-draft-lens must be positive integers (got {bad[0]}); e.g. 1,2,3,4")
    train = load_prompts(stream, "train", train_limit, target=target)
    test = load_prompts(stream, eval_split, eval_limit, target=target) if eval_split else []
    ad = OnlineAdapter(drafter, target, state or out / "state", cfg)
    ev: dict = {"split": eval_split} if test else {}
    if test:
        with _bar(len(test), "eval before", progress) as bar:
            ev["before"] = ad.evaluate(
                test,
                ad.initial,
                ad.initial_cache,
                progress=lambda m: (bar.update(1), bar.set_postfix(acc=f"{m.acceptance:.3f}")),
            ).summary()
    with _bar(len(train), f"adapt {stream}", progress) as bar:
        acc, prop = [0], [0]

        def on_prompt(i: int, rec) -> None:
            if rec is not None:
                acc[0] += rec.accepted
                prop[0] += rec.proposed
            bar.update(1)
            bar.set_postfix(acc=f"{acc[0] / max(prop[0], 1):.3f}", upd=ad.updates)

        log = ad.run(train, on_prompt)
    exports = ad.export() if cfg.publish.export_formats else {}
    if test:
        final_cache = ad._cache_copy()
        with _bar(len(test), "eval after", progress) as bar:
            after = ad.evaluate(
                test,
                ad.published,
                final_cache,
                progress=lambda m: (bar.update(1), bar.set_postfix(acc=f"{m.acceptance:.3f}")),
            )
        ev["after"] = after.summary()
        with _bar(len(test), "eval cache only", progress) as bar:
            ev["cache_only"] = ad.evaluate(
                test,
                ad.initial,
                final_cache,
                progress=lambda m: (bar.update(1), bar.set_postfix(acc=f"{m.acceptance:.3f}")),
            ).summary()
        if eval_draft_lens:
            ev["by_draft_len"] = _by_draft_len(ad, test, final_cache, eval_draft_lens, progress)
        if greedy_check:
            from omnidraft.runtime.decode_config import DecodeConfig

            from .guard import measure

            tcfg = DecodeConfig(max_new_tokens=cfg.decoding.max_new_tokens, temperature=0.0, mode="target-only")
            ref = measure(ad.decoder, test[:greedy_check], tcfg)
            same = sum(a == b for a, b in zip(after.outputs, ref.outputs))
            ev["greedy_identical"] = {"checked": min(len(ref.outputs), len(after.outputs)), "same": same}
    n = len(log.acceptance)
    q = max(1, n // 4)

    def _rate(a, p):
        return sum(a) / sum(p) if sum(p) else 0.0

    skipped = sum(1 for e in log.events if e.get("event") == "skipped-update")
    result = {
        "stream": stream,
        "drafter": str(drafter),
        "target": str(target),
        "state": str(ad.dir),
        "target_id": ad.ident.target_id,
        "resumed_adapter": ad.resumed,
        "engine": ad.trainer.engine,
        "config": ad.config_dict(),
        "lr": ad.trainer.lr,
        "stream_summary": {
            "prompts": n,
            "skipped_prompts": log.skipped_prompts,
            "updates": ad.updates,
            "skipped_updates": skipped,
            "acceptance": round(_rate(log.accepted, log.proposed), 4),
            "first_quarter": round(_rate(log.accepted[:q], log.proposed[:q]), 4),
            "last_quarter": round(_rate(log.accepted[-q:], log.proposed[-q:]), 4),
            "rollbacks": sum(1 for e in log.events if e.get("action") == "rolled-back"),
            "dm_positions": log.dm_positions,
            "ngram_positions": log.ngram_positions,
            "buffer_bytes": log.buffer_bytes,
            "mean_topk_mass": round(sum(log.topk_mass) / len(log.topk_mass), 4) if log.topk_mass else None,
            "ngram_cache_entries": len(ad.decoder.cache) if ad.decoder.cache is not None else 0,
        },
        "per_prompt": {"accepted": log.accepted, "proposed": log.proposed},
        "losses": log.losses,
        "events": log.events,
        "eval": ev,
        "exports": exports,
        "seconds": {
            "decode": round(log.decode_seconds, 1),
            "train": round(log.train_seconds, 1),
            "publish": round(log.publish_seconds, 1),
            "total": round(time.perf_counter() - t_start, 1),
        },
    }
    if ad.head is not None:
        import numpy as np

        from .head import calibration, plot_calibration

        cal = calibration(np.asarray(log.head_predicted, np.float32), np.asarray(log.head_observed, np.float32))
        result["head"] = {
            "variant": cfg.head.variant,
            "updates": sum("loss" in x for x in ad.head.losses),
            "losses": ad.head.losses,
            "calibration": cal,
            "observed_target_tokens": len(log.head_observed),
            "file": str(ad.dir / "drafter" / "head.json"),
        }
        out.mkdir(parents=True, exist_ok=True)
        if plot_calibration(
            {stream: {f"{cfg.head.variant} (during the stream)": cal}},
            out / "calibration.png",
            "acceptance head calibration",
        ):
            result["head"]["plot"] = str(out / "calibration.png")
    result["files"] = reporting.write(out, result, log.accepted, log.proposed, cfg.schedule.every)
    return result
