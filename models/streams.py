"""Task streams `code`, `math`, `text`, mirroring the paper's HumanEval/MBPP, GSM8K and Alpaca/XSum.

Each stream has a deterministic ``train`` split (1000 prompts) and a held-out ``test`` split (100
prompts). Test prompts come only from documents that ``data.is_heldout`` reserves (held-out stdlib
modules and HumanEval problems, held-out Shakespeare plays and Python-doc pages) or from the math
seed range ``TEST_SEED0..``, none of which the target's training data contains.
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from dataclasses import dataclass
from pathlib import Path

from omnidraft.errors import DataError
from omnidraft.models import data, mathgen
from omnidraft.validate import Fields, MiB, decode_utf8, iter_lines, parse_json

STREAMS = ("code", "math", "text")
SPLITS = ("train", "test")
COUNTS = {"train": 1000, "test": 100}
# Math seeds: stream train prompts, stream test prompts, and the target's training problems are
# three disjoint ranges (training additionally drops any problem whose question equals a test one).
TRAIN_SEED0, TEST_SEED0, CORPUS_SEED0 = 0, 1_000_000, 2_000_000
PROMPT_CHARS, REFERENCE_CHARS = 320, 320
MAX_LINE_BYTES = MiB  # one prompt line of a user stream file


@dataclass(frozen=True)
class Prompt:
    id: str
    stream: str
    prompt: str  # text the model continues
    reference: str  # the true continuation (for perplexity, distillation, agreement)


def _check(name: str, split: str) -> None:
    if name not in STREAMS:
        raise DataError(f"unknown stream {name!r}; valid streams: {', '.join(STREAMS)}")
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; use one of: {', '.join(SPLITS)}")


def _sample(items: list, count: int, key: str) -> list:
    items = sorted(items, key=lambda p: p.id)
    random.Random(key).shuffle(items)
    return items[:count]


def _code(split: str, pool: bool = False) -> list[Prompt]:
    test = split == "test"
    he = [p for p in data.load_humaneval() if data.is_heldout(f"humaneval:{p['task_id']}") == test]
    out = [Prompt(f"code/{p['task_id']}", "code", p["prompt"], p["canonical_solution"]) for p in he]
    fns = []
    for doc in data.load_corpus("stdlib"):
        if data.is_heldout(doc.id) == test:
            for name, prompt, ref in data.function_snippets(doc):
                fns.append(Prompt(f"code/{doc.id}:{name}:{len(fns)}", "code", prompt, ref))
    picked = _sample(fns, len(fns), f"code-{split}")
    if test:
        # The same method can sit in a held-out and a training module (abstract base classes):
        # a test prompt must not occur verbatim anywhere in the training code.
        seen = "\n".join(d.text for d in data.train_documents("code"))
        picked = [p for p in picked if p.prompt not in seen][: COUNTS[split] * 2]
    return out + (picked if pool else picked[: COUNTS[split] - len(out)])


def _unique_problems(start: int, count: int, exclude: set[str]) -> list[mathgen.Problem]:
    """`count` problems from seed `start` on, skipping questions in `exclude` (small number ranges
    make an identical question under another seed possible)."""
    out, seed, seen = [], start, set(exclude)
    while len(out) < count:
        p = mathgen.make_problem(seed)
        seed += 1
        if p.question not in seen:
            out.append(p)
            seen.add(p.question)
    return out


def _test_questions() -> set[str]:
    return {p.question for p in _unique_problems(TEST_SEED0, COUNTS["test"], set())}


def _math(split: str, count: int | None = None) -> list[Prompt]:
    if split == "test":
        probs = _unique_problems(TEST_SEED0, COUNTS["test"], set())
    else:
        probs = _unique_problems(TRAIN_SEED0, count or COUNTS["train"], _test_questions())
    return [Prompt(f"math/{p.seed}", "math", f"Question: {p.question}\nAnswer:", " " + p.solution) for p in probs]


def _cut(text: str, n: int) -> str:
    """At most `n` chars of `text`, ending at a whitespace boundary so no word is split."""
    if len(text) <= n:
        return text
    cut = text[:n]
    i = max(cut.rfind(" "), cut.rfind("\n"))
    return cut[: i + 1] if i > n // 2 else cut


def _passages(doc: data.Document) -> list[Prompt]:
    text = doc.text
    out = []
    # Passages start at paragraph starts that open with a letter (skips reST directives, markup,
    # stage-direction brackets) and need enough room for prompt and reference.
    for m in re.finditer(r"\n\n(?=[A-Z][a-z])", text):
        start = m.end()
        body = text[start : start + PROMPT_CHARS + REFERENCE_CHARS + 200]
        if len(body) < PROMPT_CHARS + REFERENCE_CHARS:
            continue
        prompt = _cut(body, PROMPT_CHARS)
        reference = _cut(body[len(prompt) :], REFERENCE_CHARS)
        if sum(c.isalpha() for c in prompt) < 0.6 * len(prompt):
            continue  # tables, code listings
        out.append(Prompt(f"text/{doc.id}@{start}", "text", prompt, reference))
    return out


def _text(split: str, pool: bool = False) -> list[Prompt]:
    test = split == "test"
    docs = [d for d in data.load_corpus("gutenberg") + data.load_corpus("pydoc") if data.is_heldout(d.id) == test]
    by_source: dict[str, list[Prompt]] = {"gutenberg": [], "pydoc": []}
    for d in docs:
        by_source["pydoc" if d.id.startswith("pydoc:") else "gutenberg"].extend(_passages(d))
    # Half literature, half documentation prose, as the paper mixes instruction text and news.
    half = COUNTS[split] // 2
    lit = _sample(by_source["gutenberg"], len(by_source["gutenberg"]), f"text-lit-{split}")
    doc = _sample(by_source["pydoc"], len(by_source["pydoc"]), f"text-doc-{split}")
    head = lit[:half] + doc[: COUNTS[split] - len(lit[:half])]
    if not pool:
        return head
    rest = lit[half:], doc[COUNTS[split] - half :]
    return head + [p for pair in itertools.zip_longest(*rest) for p in pair if p is not None]


@functools.cache
def _load(name: str, split: str) -> tuple[Prompt, ...]:
    prompts = {"code": _code, "math": _math, "text": _text}[name](split)
    if len(prompts) < COUNTS[split]:
        raise DataError(
            f"stream {name}/{split} has only {len(prompts)} prompts; the data cache looks incomplete: "
            f"delete {data.cache_dir()} and {data.FIX_HINT}"
        )
    return tuple(prompts)


@functools.cache
def _pool(name: str, count: int) -> tuple[Prompt, ...]:
    if name == "math":
        return tuple(_math("train", count))
    prompts = {"code": _code, "text": _text}[name]("train", pool=True)
    head, seen = prompts[: COUNTS["train"]], {p.prompt for p in prompts[: COUNTS["train"]]}
    # The same method sits in several modules: answering its prompt twice adds nothing.
    more = [p for p in prompts[COUNTS["train"] :] if not (p.prompt in seen or seen.add(p.prompt))]
    return tuple((head + more)[:count])


def train_pool(name: str, count: int) -> list[Prompt]:
    """The stream's train prompts and after them more from the same training documents (or math
    seeds), ``count`` in all where the documents hold that many: the train split is the pool's
    first ``COUNTS["train"]``, so an offline teacher pass can answer more prompts than the split has
    and still never a held-out one. Online adaptation and evaluation keep to the split."""
    _check(name, "train")
    if count <= COUNTS["train"]:
        return list(_load(name, "train"))[:count]
    return list(_pool(name, count))


def load_stream(name: str, split: str = "train", *, target: Path | None = None) -> list[Prompt]:
    """The prompts of stream `name` ("code", "math", "text") for `split` ("train" or "test");
    with ``target`` (a model or export folder), as that model reads them (``for_target``)."""
    _check(name, split)
    prompts = list(_load(name, split))
    return for_target(prompts, target) if target is not None else prompts


def for_target(prompts: list[Prompt], target: Path) -> list[Prompt]:
    """Prompts wrapped in the target's chat template where it has one (an instruct model answers a
    user turn); a base model's prompts are returned as they are."""
    from dataclasses import replace

    from omnidraft.runtime.chat import load_template, render

    template = load_template(target)
    if template is None:
        return prompts
    return [replace(p, prompt=render(template, p.prompt)) for p in prompts]


def load_stream_file(path: str | Path) -> list[Prompt]:
    """A user stream: JSONL with one {"prompt": str, optional "reference", "id"} object per line,
    UTF-8, each line at most ``MAX_LINE_BYTES`` (read line by line: a huge or binary file is refused
    at its first bad line)."""
    path = Path(path)
    fix = 'each line must be a UTF-8 JSON object {"prompt": "..."}'
    if not path.exists():
        raise DataError(f'stream file {path} does not exist; pass a JSONL file with one {{"prompt": ...}} per line')
    prompts = []
    for n, raw in iter_lines(path, error=DataError, what="stream file", fix=fix, limit=MAX_LINE_BYTES):
        where = f"{path} line {n}"
        line = decode_utf8(raw, error=DataError, where=where, fix=fix)
        if not line.strip():
            continue
        f = Fields(parse_json(line, error=DataError, where=where, fix=fix), where=where, error=DataError, fix=fix)
        prompt = f.obj.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise DataError(f'{where} has no non-empty string "prompt" field; {fix}')
        ref = f.str("reference", default="")
        pid = f.obj.get("id", f"{path.stem}/{n}")
        if not isinstance(pid, (str, int)) or isinstance(pid, bool):
            raise f.fail("id", "a string or an integer", pid)
        prompts.append(Prompt(str(pid), "file", prompt, ref))
    if not prompts:
        raise DataError(f'stream file {path} is empty; add one {{"prompt": "..."}} object per line')
    return prompts


def math_training_problems(count: int) -> list[mathgen.Problem]:
    """`count` generated problems for target training, none sharing a question with a stream prompt."""
    held = _test_questions()
    out, seed = [], CORPUS_SEED0
    while len(out) < count:
        p = mathgen.make_problem(seed)
        seed += 1
        if p.question not in held:
            out.append(p)
    return out
