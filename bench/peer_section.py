"""The peers section: omnidraft on each backend vs Hugging Face transformers on the same prompts,
all timed in one interleaved group (every peer decodes prompt i before any decodes prompt i+1)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from omnidraft.bench import llamacpp_peer, ortgenai_peer
from omnidraft.bench.engine import interleave
from omnidraft.bench.peers import PROMPT_LOOKUP_TOKENS, HFPeers, uag_configs
from omnidraft.bench.settings import LOOKUP
from omnidraft.errors import OmnidraftError
from omnidraft.models.streams import load_stream

if TYPE_CHECKING:
    from omnidraft.bench.method_table import Bench, _Stream

OWN_BACKENDS = ("torch", "ort", "executorch")
REPLAYABLE = ("spd-dm", "spd-dm+ngram", "spd-dm+ngram_pp")


# ExecuTorch drafters carry no acceptance head yet, so adaptive drafting cannot run there.
NEEDS_HEAD = ("hybrid+adaptive",)


def best_method(bench: Bench, st: _Stream, backend: str | None = None) -> str | None:
    """The fastest measured method of this stream on the main backend that can be replayed on
    ``backend`` (an adapted drafter is an HF folder, exported like any other)."""
    from omnidraft.bench import adapted_rows

    rows = [
        r
        for r in bench.report["rows"]
        if r["stream"] == st.name
        and r.get("status") == "ok"
        and r["method"] != "target-only"
        and ((base := r["method"].removesuffix(LOOKUP)) in REPLAYABLE or adapted_rows.replayable(base))
        and not (backend == "executorch" and r["method"] in NEEDS_HEAD)
    ]
    return max(rows, key=lambda r: r["tokens_per_s"])["method"] if rows else None


def _own_jobs(bench: Bench, st: _Stream, backend: str, method: str) -> list:
    """Target-only and ``method`` on ``backend``, starting from the same state as the method row."""
    from omnidraft.bench import adapted_rows

    s = bench.s
    eng = bench.engine(backend)
    mode, cache, drafter = "ngram", eng.new_cache(), None
    k, tune = st.ks.get(method, st.draft_len), None
    lookup = s.lookup if method.endswith(LOOKUP) else None
    method = method.removesuffix(LOOKUP)
    if method == "spd-dm":
        mode = "dm"
    elif method == "spd-dm+ngram_pp":
        cache = eng.load_cache(st.pp_cache)
    elif method not in REPLAYABLE:
        drafter, cache = adapted_rows.for_backend(bench, eng, st.name, method)
        eng.warm_up(bench.warm_prompt, drafter)
    if method == "hybrid+adaptive":  # adaptive drafting from --gamma and K_max 16, tuned online (as its row)
        from omnidraft.errors import InvalidArgument
        from omnidraft.runtime.draft_length.controller import GammaController
        from omnidraft.runtime.draft_length.head_file import ET_NO_HEAD
        from omnidraft.runtime.draft_length.policy import has_accept_head

        if not has_accept_head(drafter.backend):
            raise InvalidArgument(f"the {backend} drafter has no acceptance head ({ET_NO_HEAD})")
        # tuned on the same train prompts as the row, on this backend's own costs
        k, tune = "auto", GammaController(gamma=s.gamma, k_max=16)
        skip = bench.adapted[(st.name, method)]["summary"]["train_prompts"]
        bench.tune_controller(
            eng, st.name, load_stream(st.name, "train", target=bench.pair.target), drafter, tune, skip
        )
    return [
        eng.job(f"omnidraft-{backend} target-only", st.prompts, "target-only", st.draft_len, s.max_new_tokens),
        eng.job(
            f"omnidraft-{backend}",
            st.prompts,
            mode,
            k,
            s.max_new_tokens,
            cache=cache,
            drafter=drafter,
            tune=tune,
            lookup=lookup,
            memory=bench.pass_memory(eng, st, method) if lookup is not None else None,
        ),
    ]


def _peer(stream: str, name: str, run, hf_base, reference, reference_name: str | None, **extra) -> dict:
    tps = run.tokens_per_s
    return {
        "stream": stream,
        "name": name,
        "tokens_per_s": round(tps, 2),
        "prompts": run.prompts,
        "speedup_vs_hf_target_only": round(tps / hf_base.tokens_per_s, 4) if hf_base and hf_base.tokens_per_s else None,
        "outputs_match_target_only": run.outputs == reference if reference is not None else None,
        "compared_with": reference_name if reference is not None else None,
        **(_agreement(run.outputs, reference) if reference is not None else {}),
        "status": "ok",
        **extra,
    }


def _agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    """How far two greedy runs agree: prompts with identical output, and the mean number of leading
    tokens they share (a near-tie flipped late, or other weights from the first token)."""

    def prefix(a: list[int], b: list[int]) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    pairs = list(zip(outputs, reference))
    return {
        "identical_prompts": sum(a == b for a, b in pairs),
        "mean_common_prefix_tokens": round(sum(prefix(a, b) for a, b in pairs) / len(pairs), 2) if pairs else None,
    }


def run_peers(bench: Bench, st: _Stream) -> None:
    s = bench.s
    methods = {b: best_method(bench, st, b) for b in OWN_BACKENDS if b in s.peers}
    jobs, own, failed = [], [], []
    for backend, method in ((b, m) for b, m in methods.items() if m is not None):
        try:
            jobs += _own_jobs(bench, st, backend, method)
            own.append(backend)
        except Exception as exc:  # noqa: BLE001 -- e.g. an export failing its parity gate: say so, keep going
            msg = str(exc) if isinstance(exc, OmnidraftError) else repr(exc)
            failed.append(
                {**_missing(st.name, f"omnidraft-{backend}", f"failed: {msg}".splitlines()[0]), "method": method}
            )
    uag = []
    if "hf" in s.peers:
        tgt = bench.engine(s.backend).target
        if bench.hf is None:
            bench.hf = HFPeers(bench.pair.drafter, bench.pair.target, tgt.eos_ids)
        ids = [list(tgt.codec.start_ids) + tgt.codec.encode(p) for p in st.prompts]
        jobs.append(bench.hf.job("hf-target-only", {}, ids, s.max_new_tokens))
        for cfg in uag_configs(st.draft_len, bench.hf.uag_defaults):
            jobs.append(bench.hf.job("hf-assisted-uag", cfg, ids, s.max_new_tokens))
            uag.append(jobs[-1].name)
        jobs.append(
            bench.hf.job("hf-prompt-lookup", {"prompt_lookup_num_tokens": PROMPT_LOOKUP_TOKENS}, ids, s.max_new_tokens)
        )
    own_vocab = []  # peers decoding the target's own token ids: llama.cpp, onnxruntime-genai
    if "llama.cpp" in s.peers:
        why = llamacpp_peer.unavailable_reason(bench.pair.target, s.threads or 1)
        if why is not None:  # not installed or no GGUF: the rows say why
            failed += [_missing(st.name, n, why) for n in llamacpp_peer.PEER_NAMES]
        else:
            own_vocab += _llamacpp_jobs(bench, st)
    if "ort-genai" in s.peers:
        export_dir = _ort_target(bench)
        why = ortgenai_peer.unavailable_reason(export_dir)
        if why is not None:
            failed.append(_missing(st.name, ortgenai_peer.PEER_NAME, why))
        else:
            own_vocab.append(_genai_job(bench, st, export_dir))
    jobs += own_vocab
    bench.report["peers"].extend(failed)
    if not jobs:
        return
    runs = interleave(jobs, len(st.prompts), f"{st.name}: {len(jobs)} peers in lockstep", bench.progress)
    peers = bench.report["peers"]
    hf_base = runs.get("hf-target-only")
    if hf_base is not None:
        torch_ref = runs.get("omnidraft-torch target-only")
        # Same engine, same prompt ids: HF's greedy output should equal ours token for token.
        peers.append(
            _peer(
                st.name,
                "hf-target-only",
                hf_base,
                hf_base,
                torch_ref.outputs if torch_ref else None,
                "omnidraft torch target-only",
                config={},
            )
        )
    for backend in own:
        base, run, method = runs[f"omnidraft-{backend} target-only"], runs[f"omnidraft-{backend}"], methods[backend]
        peers.append(
            _peer(
                st.name,
                f"omnidraft-{backend}",
                run,
                hf_base,
                base.outputs,
                f"omnidraft {backend} target-only",
                method=method,
                draft_len="auto" if method == "hybrid+adaptive" else st.ks.get(method, st.draft_len),
                own_target_only_tokens_per_s=round(base.tokens_per_s, 2),
                speedup_vs_own_target_only=round(run.tokens_per_s / base.tokens_per_s, 4)
                if base.tokens_per_s
                else None,
            )
        )
    if own_vocab:
        # The target's own vocabulary (llama.cpp reads the GGUF it was converted from, onnxruntime-genai
        # our export), same prompt ids: their greedy tokens compare with ours.
        ref = "ort" if "ort" in own else own[0] if own else None
        own_ref = runs[f"omnidraft-{ref} target-only"] if ref else hf_base
        ref_name = f"omnidraft {ref} target-only" if ref else "hf-target-only"
        for job in own_vocab:
            run = runs[job.name]
            peers.append(
                _peer(
                    st.name, job.name, run, hf_base, own_ref.outputs if own_ref else None, ref_name, config=run.config
                )
            )
    if hf_base is not None:
        tried = [runs[n] for n in uag]
        best = max(tried, key=lambda r: r.tokens_per_s)
        peers.append(
            _peer(
                st.name,
                "hf-assisted-uag",
                best,
                hf_base,
                hf_base.outputs,
                "hf-target-only",
                config=best.config,
                tried=[{"config": r.config, "tokens_per_s": round(r.tokens_per_s, 2)} for r in tried],
            )
        )
        pl = runs["hf-prompt-lookup"]
        peers.append(
            _peer(st.name, "hf-prompt-lookup", pl, hf_base, hf_base.outputs, "hf-target-only", config=pl.config)
        )


def _missing(stream: str, name: str, why: str) -> dict:
    return {
        "stream": stream,
        "name": name,
        "status": why,
        "tokens_per_s": None,
        "speedup_vs_hf_target_only": None,
        "outputs_match_target_only": None,
    }


def _llamacpp_jobs(bench: Bench, st: _Stream) -> list:
    """llama.cpp's target-only and prompt-lookup rows on the target's own GGUF file, fed the same
    prompt ids as every other row."""
    s = bench.s
    tgt = bench.engine(s.backend).target
    if bench.llamacpp is None:
        bench.llamacpp = llamacpp_peer.LlamaCppPeers(
            bench.pair.target, tgt.eos_ids, threads=s.threads or 1, n_ctx=s.max_seq_len
        )
    ids = [list(tgt.codec.start_ids) + tgt.codec.encode(p) for p in st.prompts]
    return [bench.llamacpp.job(name, ids, s.max_new_tokens) for name in llamacpp_peer.PEER_NAMES]


def _ort_target(bench: Bench) -> Path:
    """The ONNX Runtime target export the omnidraft-ort rows run (exported now if no row has)."""
    from omnidraft.bench.bundled import target_export
    from omnidraft.bench.demo import BACKENDS

    if "ort" in bench.engines:
        return bench.engines["ort"].paths[1]
    return target_export(bench.pair.target, *BACKENDS["ort"], bench.s.max_seq_len, bench.progress)


def _genai_job(bench: Bench, st: _Stream, export_dir: Path):
    """onnxruntime-genai's target-only row on that export, fed the same prompt ids."""
    s = bench.s
    tgt = bench.engine(s.backend).target
    if bench.genai is None:
        bench.genai = ortgenai_peer.OrtGenaiPeer(export_dir, tgt.eos_ids, threads=s.threads or 1)
    ids = [list(tgt.codec.start_ids) + tgt.codec.encode(p) for p in st.prompts]
    return bench.genai.job(ids, s.max_new_tokens)
