"""Teacher shards: a real target's distributions over training text or its own answers, stored once
in the drafter's token positions, so a drafter recipe learns from several targets without loading them.

    python -m omnidraft.models.teacher_shards --teacher qwen2.5-coder-0.5b-instruct \\
        --drafter models/bundled/drafter --mix code=1 --chars 200000 --out DIR

    python -m omnidraft.models.teacher_shards --teacher qwen2.5-coder-0.5b-instruct \\
        --drafter models/bundled/drafter --stream code --prompts 256 --generate 128 --out DIR

    python -m omnidraft.models.teacher_shards --teacher qwen2.5-coder-0.5b-instruct \\
        --drafter models/bundled/drafter --stream code --prompts 1000 --sample-temperature 1 --out DIR

A teacher pass turns a target's logits into the records the online adapter trains on
(``adapt.buffer.Collector``): directly-mapped positions with the teacher's top-K log-probabilities
over the vocabulary intersection, and n-gram / split positions. So offline distillation and online
adaptation share one loss (the paper's hybrid loss, through this teacher's direct map and n-grams)
and one record layout. The text comes from the recipe corpora's training pieces (held-out documents
excluded, teacher forcing) or, with ``--stream``, from the teacher's own greedy answers to a stream's
train prompts, wrapped as the runtime wraps them: what the drafter is verified against is what the
target writes, and an instruct target's answers are not the corpus. A stream has a fixed number of
train prompts; ``--sample-temperature`` answers them again along other paths the target itself is
likely to write (``--samples`` answers per prompt), each position still storing the teacher's own
distribution there, so the drafter gets more of what the target writes than the prompts alone give.

``DIR`` is the pass's folder (models/teacher_store.py says what it holds). Shards are published one by
one, so an interrupted pass resumes at the first missing shard.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from omnidraft.atomic import atomic_path, write_json
from omnidraft.errors import InvalidArgument, OmnidraftError
from omnidraft.models.teacher_store import FORMAT, MANIFEST, VOCAB_FILE, read_manifest, save_shard, shards_dir
from omnidraft.runtime.manifest import sha256_file

DTYPES = ("float32", "bfloat16")  # what a pass stores; "auto" picks one of them for the device


@dataclass(frozen=True)
class PassSpec:
    """What a teacher pass stores; every field is in the manifest, and a resumed pass must match it."""

    k: int = 32  # top-K intersection entries per directly-mapped position
    temperature: float = 1.0
    texts_per_shard: int = 64
    max_tokens: int = 192  # teacher tokens per forward (longer pieces are cut): ~256 drafter tokens, a recipe row
    dtype: str = "float32"  # the teacher's compute dtype, or "auto" (fast_dtype) until the pass starts
    generate: int = 0  # > 0: texts are prompts, and the records are the teacher's own greedy answers to them
    batch: int = 8  # prompts answered at once (a decode step reads the weights once for the whole batch)
    sample_temperature: float = 0.0  # 0: greedy answers; > 0: answers sampled from p^(1/T), no top-k / top-p cut
    seed: int = 0  # the sampled answers' seed (a shard's answers depend only on it and the shard)

    def validate(self) -> None:
        if self.k < 1:
            raise InvalidArgument(f"--k must be >= 1 (got {self.k})")
        if not self.temperature > 0:
            raise InvalidArgument(f"--temperature must be > 0 (got {self.temperature})")
        if self.texts_per_shard < 1 or self.max_tokens < 8:
            raise InvalidArgument("--texts-per-shard must be >= 1 and --max-tokens >= 8")
        if self.generate < 0 or self.batch < 1:
            raise InvalidArgument("--generate must be >= 0 and --batch >= 1")
        if not self.sample_temperature >= 0:
            raise InvalidArgument(f"--sample-temperature must be >= 0, 0 for greedy (got {self.sample_temperature})")
        if self.dtype not in ("auto", *DTYPES):
            raise InvalidArgument(f"--dtype must be auto or one of {', '.join(DTYPES)} (got {self.dtype!r})")


def fast_dtype(device) -> str:
    """bfloat16 where the device multiplies it natively (AVX512-BF16 or AMX on a CPU, a CUDA GPU that
    supports it), else float32: without those instructions a CPU runs bfloat16 matmuls about 4x
    slower than float32 (an AVX2-only EPYC, a decode step's shapes: 5.1 against 20.2 GFLOPS a thread)."""
    import torch

    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    if device.type == "cpu":
        caps = torch.cpu.get_capabilities()
        return "bfloat16" if caps.get("avx512_bf16") or caps.get("amx_bf16") else "float32"
    return "float32"


def texts_digest(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode("utf-8")).digest())
    return h.hexdigest()


def corpus_texts(mix: dict[str, float], chars: int, *, seed: int = 1234) -> list[str]:
    """Training pieces of each domain in ``mix`` (held-out documents excluded), about ``chars`` in all."""
    from omnidraft.models.train import _domain_texts

    out: list[str] = []
    for domain, frac in sorted(mix.items()):
        out.extend(_domain_texts(domain, seed, int(frac * chars)))
    return out


def stream_prompts(streams: list[str], limit: int, *, teacher: str | Path, skip: int = 0) -> list[str]:
    """``limit`` train prompts of each stream after its first ``skip``, wrapped in the teacher's chat
    template where it has one (as the runtime wraps them). Past the split's 1,000 they come from the
    stream's training pool (``streams.train_pool``), so a pass can extend an earlier one; held-out
    prompts are never answered."""
    from omnidraft.models.sources import resolve
    from omnidraft.models.streams import STREAMS, for_target, train_pool

    bad = [s for s in streams if s not in STREAMS]
    if bad or limit < 1 or skip < 0:
        raise InvalidArgument(
            f"--stream takes {', '.join(STREAMS)}, --prompts >= 1 and --skip-prompts >= 0 "
            f"(got {','.join(streams)}, {limit}, {skip})"
        )
    out = []
    for s in streams:
        pool = train_pool(s, skip + limit)
        if len(pool) < skip + limit:
            raise InvalidArgument(
                f"stream {s} has {len(pool)} training prompts, fewer than --skip-prompts {skip} + --prompts "
                f"{limit}; ask for at most {len(pool)} in all"
            )
        out.extend(p.prompt for p in for_target(pool[skip:], resolve(teacher)))
    return out


def _map_teacher(drafter_dir: Path, teacher_dir: Path):
    from omnidraft.runtime.tokenizer import load_codec
    from omnidraft.runtime.vocab import build_vocab_map

    dc, tc = load_codec(drafter_dir), load_codec(teacher_dir)
    vocab = build_vocab_map(dc, tc)
    if vocab.size == 0:
        raise InvalidArgument(
            f"teacher {teacher_dir}'s tokenizer shares no token spelling with the drafter's ({drafter_dir}), "
            "so it cannot be mapped; choose a teacher whose tokenizer spells text in bytes or SentencePiece pieces"
        )
    return dc, tc, vocab


def _prompt_split(codec, ids: list[int]) -> int:
    """The fewest leading teacher tokens (>= 1) that spell whole UTF-8 characters: the records' prompt."""
    for n in range(1, len(ids)):
        try:
            codec.spell(ids[:n]).decode("utf-8")
            return n
        except UnicodeDecodeError:
            continue
    return len(ids)


def _answers(
    prompts: list[str], model, tc, spec: PassSpec, *, offset: int = 0
) -> Iterator[tuple[list[int], list[int], np.ndarray]]:
    """(prompt ids, the teacher's answer, its logits row per answer token) for each prompt,
    ``spec.batch`` prompts per ``generate`` call (left-padded), each answer cut at its first EOS.
    Answers are greedy, or sampled at ``spec.sample_temperature`` with a seed of ``spec.seed`` and the
    batch's index ``offset + b`` in the pass, so a resumed pass samples what the first run did; the
    logits rows are the teacher's own (before the temperature), the distribution the records store.
    Yielded one by one: held together, a shard's answers' logits rows are ~8 GiB at Gemma's 262k
    vocabulary (64 prompts x 128 tokens, float32; a Gemma pass was killed at 14 GiB RSS beside
    other jobs), and the caller needs only each answer's record."""
    import torch
    from transformers import GenerationConfig

    pad = min(tc.eos_ids) if tc.eos_ids else 0
    for b in range(0, len(prompts), spec.batch):
        ids = [list(tc.start_ids) + tc.encode(p) for p in prompts[b : b + spec.batch]]
        width = max(map(len, ids))
        x = torch.tensor([[pad] * (width - len(i)) + i for i in ids], device=model.device)
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids], device=model.device)
        # a fresh config: the model's own may carry a repetition penalty, which greedy decoding here has not
        sample = spec.sample_temperature > 0
        cfg = GenerationConfig(
            max_new_tokens=spec.generate,
            do_sample=sample,
            # no top-k / top-p cut: the paths are the target's own at this temperature
            **({"temperature": spec.sample_temperature, "top_k": 0, "top_p": 1.0} if sample else {}),
            eos_token_id=sorted(tc.eos_ids) or None,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )
        with torch.inference_mode(), torch.random.fork_rng(devices=[] if model.device.type == "cpu" else None):
            torch.manual_seed(spec.seed * 1_000_003 + offset + b)
            g = model.generate(input_ids=x, attention_mask=mask, generation_config=cfg)
        for r, prompt_ids in enumerate(ids):
            answer = g.sequences[r, width:].tolist()
            stop = next((n for n, t in enumerate(answer) if t in tc.eos_ids), len(answer))
            # row by row: one float32 copy of the whole batch's logits is gigabytes at a 262k vocabulary
            rows = (
                torch.stack([step[r] for step in g.logits[:stop]]).float().cpu().numpy() if stop else np.zeros((0, 0))
            )
            yield prompt_ids, answer[:stop], rows


def _records_of(texts, model, dc, tc, vocab, spec: PassSpec, *, offset: int = 0):
    import torch

    from omnidraft.adapt.buffer import Collector

    col = Collector(dc, tc, vocab, k=spec.k, temperature=spec.temperature)
    start = list(tc.start_ids)
    out = []
    if spec.generate:
        for prompt, (_, answer, logits) in zip(texts, _answers(texts, model, tc, spec, offset=offset)):
            if answer:
                col.start(prompt)  # the loop's own view: the prompt as text, the answer as verified tokens
                col.on_verified(answer, logits)
                out.append(col.finish())
        return out
    for text in texts:
        doc = tc.encode(text)
        for w in range(0, len(doc), spec.max_tokens):  # a long piece is several records, none of it dropped
            ids = doc[w : w + spec.max_tokens]
            p = _prompt_split(tc, ids)
            if p >= len(ids):
                continue  # too short, or the window opens inside a UTF-8 character
            with torch.inference_mode():
                x = torch.tensor([start + ids], device=model.device)
                logits = model(input_ids=x).logits[0].float().cpu().numpy()
            col.start(tc.spell(ids[:p]).decode("utf-8"))
            first = len(start) + p - 1  # row predicting ids[p]
            col.on_verified(ids[p:], logits[first : first + len(ids) - p])
            out.append(col.finish())
    return out


def teacher_pass(
    *,
    teacher: str | Path,
    drafter: str | Path,
    texts: list[str],
    out: str | Path,
    spec: PassSpec = PassSpec(),
    progress: bool = True,
    device: str | None = "cpu",
) -> dict:
    """Runs (or resumes) one teacher over ``texts`` on ``device`` (models/train_resources.py);
    returns the manifest. A pass may resume on another device: each shard is whole on its own."""
    import torch
    from safetensors.numpy import save_file
    from tqdm import tqdm

    from omnidraft.models.sources import resolve

    from .train_resources import resolve_device

    spec.validate()
    dev = resolve_device(device)
    if not texts:
        raise InvalidArgument("the teacher pass got no text; raise --chars or check the --mix domains")
    out, drafter_dir, teacher_dir = shards_dir(out), Path(drafter), resolve(teacher)
    if spec.dtype == "auto":  # a pass resumes in the dtype it started with, on whatever device
        stored = read_manifest(out).get("spec", {}).get("dtype") if (out / MANIFEST).is_file() else None
        spec = replace(spec, dtype=stored if stored in DTYPES else fast_dtype(dev))
    dc, tc, vocab = _map_teacher(drafter_dir, teacher_dir)  # an unmappable teacher fails before its weights load
    ident = {
        "format": FORMAT,
        "teacher": str(teacher),
        "teacher_tokenizer_sha256": tc.sha256,
        "drafter": str(drafter),
        "drafter_tokenizer_sha256": dc.sha256,
        "intersection": vocab.size,
        "texts_sha256": texts_digest(texts),
        "texts": len(texts),
        "spec": asdict(spec),
    }
    manifest = {**ident, "shards": []}
    path = out / MANIFEST
    if path.is_file():
        old = read_manifest(out)
        if isinstance(old.get("spec"), dict):  # a pass stored before a spec field existed used its default
            old["spec"] = {**asdict(PassSpec()), **old["spec"]}
        differs = [key for key, v in ident.items() if old.get(key) != v]
        if differs:
            raise InvalidArgument(
                f"{out} holds a teacher pass with another {differs[0]}; pass a new --out (or delete {out})"
            )
        manifest = old
    out.mkdir(parents=True, exist_ok=True)
    if not (out / VOCAB_FILE).is_file():
        with atomic_path(out / VOCAB_FILE) as tmp:
            save_file({"drafter_ids": vocab.drafter_ids.astype(np.int64)}, str(tmp))
    write_json(path, manifest)
    n = spec.texts_per_shard
    done = len(manifest["shards"])
    todo = range(done * n, len(texts), n)
    if not todo:
        return manifest
    from omnidraft.export.hf_model import inspect_folder, load_model

    model = load_model(inspect_folder(teacher_dir)).to(dev, getattr(torch, spec.dtype))
    bar = tqdm(total=len(texts), initial=done * n, desc=f"teacher {Path(str(teacher)).name}", disable=not progress)
    for start in todo:
        records = _records_of(texts[start : start + n], model, dc, tc, vocab, spec, offset=start)
        name = f"shard-{len(manifest['shards']):05d}.safetensors"
        if records:
            save_shard(records, out / name)
        manifest["shards"].append(
            {
                "file": name if records else None,
                "sha256": sha256_file(out / name) if records else None,
                "records": len(records),
                "drafter_tokens": sum(len(r.ids) for r in records),
                "teacher_tokens": sum(r.target_tokens for r in records),
                "dm_positions": sum(len(r.dm_rows) for r in records),
                "ngram_positions": sum(len(r.ng_rows) for r in records),
            }
        )
        write_json(path, manifest)
        bar.update(min(n, len(texts) - start))
    bar.close()
    return manifest


def _parse_mix(spec: str) -> dict[str, float]:
    from omnidraft.models.streams import STREAMS

    mix = {}
    for part in spec.split(","):
        name, _, w = part.partition("=")
        try:
            mix[name.strip()] = float(w or 1)
        except ValueError:
            raise InvalidArgument(f"--mix takes domain=weight pairs such as code=0.5,text=0.5 (got {part!r})") from None
    bad = [d for d in mix if d not in STREAMS]
    if bad or any(w <= 0 for w in mix.values()):
        raise InvalidArgument(f"--mix domains are {', '.join(STREAMS)} with weights > 0 (got {spec!r})")
    total = sum(mix.values())
    return {d: w / total for d, w in mix.items()}


def main(argv: list[str] | None = None) -> int:
    from omnidraft.cli import quiet_third_party_logs

    quiet_third_party_logs()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", required=True, help="a real model name (`omnidraft models list`) or a model folder")
    ap.add_argument("--drafter", required=True, type=Path, help="the drafter folder whose tokenizer the records use")
    ap.add_argument("--out", required=True, help="the pass's folder; cache:NAME puts it in the project cache")
    ap.add_argument("--mix", default="code=0.5,text=0.3,math=0.2", help="training domains and their shares")
    ap.add_argument(
        "--stream",
        help="instead of corpus text: this stream's train prompts (as the teacher reads them), answered by the "
        "teacher itself (--generate tokens each); comma-separated for several",
    )
    ap.add_argument("--prompts", type=int, default=64, help="train prompts per --stream")
    ap.add_argument(
        "--skip-prompts",
        type=int,
        default=0,
        help="with --stream: start after this many train prompts, to extend an earlier pass with new ones",
    )
    ap.add_argument("--generate", type=int, default=128, help="answer tokens per prompt with --stream")
    ap.add_argument("--batch", type=int, default=PassSpec.batch, help="prompts answered at once with --stream")
    ap.add_argument(
        "--sample-temperature",
        type=float,
        default=0.0,
        help="with --stream: sample the answers at this temperature (seeded by --seed) instead of greedy (0)",
    )
    ap.add_argument("--samples", type=int, default=1, help="answers per prompt with --sample-temperature")
    ap.add_argument("--chars", type=int, default=200_000, help="characters of training text to pass (all domains)")
    ap.add_argument("--seed", type=int, default=1234, help="the corpus pieces' seed, or the sampled answers'")
    ap.add_argument("--k", type=int, default=PassSpec.k)
    ap.add_argument("--temperature", type=float, default=PassSpec.temperature)
    ap.add_argument("--texts-per-shard", type=int, default=PassSpec.texts_per_shard)
    ap.add_argument("--max-tokens", type=int, default=PassSpec.max_tokens)
    ap.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", *DTYPES),
        help="the teacher's compute dtype; auto: bfloat16 where the device has bf16 matmuls, else float32",
    )
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--device", default="cpu", help="where the teacher runs: cpu (default), cuda, cuda:N, mps or auto")
    args = ap.parse_args(argv)
    try:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        if args.chars < 1:
            raise InvalidArgument(f"--chars must be >= 1 (got {args.chars})")
        if args.samples < 1 or (args.samples > 1 and not args.sample_temperature > 0):
            raise InvalidArgument(
                f"--samples must be >= 1, and > 1 only with --sample-temperature > 0 (got {args.samples})"
            )
        if args.sample_temperature and not args.stream:
            raise InvalidArgument("--sample-temperature samples answers, so it needs --stream")
        spec = PassSpec(
            k=args.k,
            temperature=args.temperature,
            texts_per_shard=args.texts_per_shard,
            max_tokens=args.max_tokens,
            dtype=args.dtype,
            generate=args.generate if args.stream else 0,
            batch=args.batch,
            sample_temperature=args.sample_temperature,
            seed=args.seed if args.sample_temperature else 0,
        )
        spec.validate()
        if args.stream:
            prompts = stream_prompts(args.stream.split(","), args.prompts, teacher=args.teacher, skip=args.skip_prompts)
            texts = [p for p in prompts for _ in range(args.samples)]
        else:
            texts = corpus_texts(_parse_mix(args.mix), args.chars, seed=args.seed)
        m = teacher_pass(
            teacher=args.teacher, drafter=args.drafter, texts=texts, out=args.out, spec=spec, device=args.device
        )
    except OmnidraftError as exc:
        print(f"teacher_shards: error: {exc}", file=sys.stderr)
        return 1
    s = m["shards"]
    print(
        f"{shards_dir(args.out)}: {sum(x['records'] for x in s)} records, {sum(x['teacher_tokens'] for x in s):,} teacher tokens, "
        f"{sum(x['dm_positions'] for x in s):,} direct-map and {sum(x['ngram_positions'] for x in s):,} n-gram positions",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
