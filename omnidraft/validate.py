"""What omnidraft reads from disk, checked before it is trusted: bounded, depth-safe, typed.

A file must be a regular file (a FIFO would block the reader, a device would feed it forever) and
within its size limit *before* it is read. JSON is parsed without NaN/Infinity and with a nesting
limit (the C decoder's own recursion guard surfaces as RecursionError; deeper trees are refused
before any recursive consumer walks them). Fields are read through ``Fields``, whose errors name the
file, the field, what was expected and how to fix it. Standard library only, so the torch-free ONNX
Runtime path uses it too.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omnidraft.errors import InvalidArgument, OmnidraftError, TokenizerError

MiB = 1 << 20
MAX_DEPTH = 32  # omnidraft's own files nest at most five deep
SMALL_JSON = 16 * MiB  # manifests, configs, heads, sidecars, shard indexes
# A model may be wider than its tokenizer (embeddings padded to a round size: Qwen2 has 151,936 rows
# for 151,665 tokens, Phi-2 51,200 for 50,295); more slack than this means another model's tokenizer.
VOCAB_PADDING = (1024, 0.05)

ErrorType = type[OmnidraftError]
_MISSING = object()


def show_size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def describe_special(path: str | Path) -> str | None:
    """What ``path`` is when it exists and is not a regular file (symlinks followed), else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else _kind(mode)


def check_regular(path: str | Path, *, error: ErrorType, what: str, fix: str) -> os.stat_result:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist; {fix}") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} {path} is {_kind(st.st_mode)}, not a regular file; {fix}")
    return st


def read_bytes(path: str | Path, *, error: ErrorType, what: str, fix: str, limit: int = SMALL_JSON) -> bytes:
    """The whole file, refused before reading when it is not regular or larger than ``limit``."""
    st = check_regular(path, error=error, what=what, fix=fix)
    if st.st_size > limit:
        raise error(f"{what} {path} is {show_size(st.st_size)}, above its {show_size(limit)} limit; {fix}")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None
    if len(data) > limit:
        raise error(f"{what} {path} grew past its {show_size(limit)} limit while being read; {fix}")
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode_utf8(data: bytes, *, error: ErrorType, where: str, fix: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); {fix}") from None


def parse_json(data: bytes | str, *, error: ErrorType, where: str, fix: str, depth: int | None = MAX_DEPTH) -> Any:
    """JSON from ``data``; ``depth`` None skips the walk over the tree (large files whose consumers
    do not recurse: lone-surrogate strings and deep nesting are then the consumer's to check)."""
    text = decode_utf8(data, error=error, where=where, fix=fix) if isinstance(data, bytes) else data
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise error(f"{where} nests JSON too deeply to read; {fix}") from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, a number with too many digits
        raise error(f"{where} is not valid JSON ({str(exc)[:160]}); {fix}") from None
    if depth is not None:
        check_tree(obj, error=error, where=where, fix=fix, depth=depth)
    return obj


def check_tree(obj: Any, *, error: ErrorType, where: str, fix: str, depth: int = MAX_DEPTH) -> None:
    """Refuse nesting deeper than ``depth`` and strings that are not Unicode text (lone surrogates
    from ``\\udXXX`` escapes), without recursion."""
    stack = [(obj, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, str):
            check_text(node, what=f"a string in {where}", fix=fix, error=error)
            continue
        if not isinstance(node, (dict, list)):
            continue
        if level > depth:
            raise error(f"{where} nests JSON deeper than {depth} levels; {fix}")
        if isinstance(node, dict):
            for k, v in node.items():
                check_text(k, what=f"a key in {where}", fix=fix, error=error)
                stack.append((v, level + 1))
        else:
            stack.extend((v, level + 1) for v in node)


def read_json(
    path: str | Path,
    *,
    error: ErrorType,
    what: str,
    fix: str,
    limit: int = SMALL_JSON,
    depth: int | None = MAX_DEPTH,
) -> Any:
    data = read_bytes(path, error=error, what=what, fix=fix, limit=limit)
    return parse_json(data, error=error, where=f"{what} {path}", fix=fix, depth=depth)


def check_text(text: str, *, what: str, fix: str, error: ErrorType = InvalidArgument) -> str:
    """``text`` if it is valid Unicode; undecodable command-line bytes arrive as lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        detail = (
            f"byte 0x{code - 0xDC00:02x} at character {exc.start} is not UTF-8"
            if 0xDC80 <= code <= 0xDCFF
            else f"lone surrogate U+{code:04X} at character {exc.start}"
        )
        raise error(f"{what} is not valid UTF-8 text ({detail}); {fix}") from None
    return text


def iter_lines(path: str | Path, *, error: ErrorType, what: str, fix: str, limit: int) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of a text file read line by line; a line longer than ``limit`` is refused
    without reading the rest of it."""
    check_regular(path, error=error, what=what, fix=fix)
    try:
        with open(path, "rb") as f:
            n = 0
            while line := f.readline(limit + 1):
                n += 1
                if len(line) > limit and not line.endswith(b"\n"):
                    raise error(f"{what} {path} line {n} is longer than {show_size(limit)}; {fix}")
                yield n, line
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None


def _show(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, (str, int, float, bool, type(None))) else type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


class Fields:
    """Typed reads from one JSON object of ``where``. A field absent with a default gives the default;
    a field present is always checked."""

    def __init__(self, obj: Any, *, where: str, error: ErrorType, fix: str, prefix: str = "") -> None:
        self.where, self.error, self.fix, self.prefix = where, error, fix, prefix
        if not isinstance(obj, dict):
            at = f" field {prefix.rstrip('.')!r}" if prefix else ""
            raise error(f"{where}{at} must be a JSON object (got {_show(obj)}); {fix}")
        self.obj = obj

    def fail(self, name: str, expected: str, got: Any = _MISSING) -> OmnidraftError:
        shown = "" if got is _MISSING else f" (got {_show(got)})"
        return self.error(f"{self.where}: field {self.prefix + name!r} must be {expected}{shown}; {self.fix}")

    def has(self, name: str) -> bool:
        return name in self.obj

    def _get(self, name: str, default: Any) -> Any:
        if name in self.obj:
            return self.obj[name]
        if default is _MISSING:
            raise self.error(f"{self.where}: required field {self.prefix + name!r} is missing; {self.fix}")
        return default

    def int(self, name: str, *, lo: int | None = None, hi: int | None = None, default: Any = _MISSING) -> int:
        v = self._get(name, default)
        if v is default and name not in self.obj:
            return v
        span = (
            f"an integer in [{lo}, {hi}]"
            if hi is not None
            else f"an integer >= {lo}"
            if lo is not None
            else "an integer"
        )
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
            raise self.fail(name, span, v)
        return v

    def optional_int(self, name: str, *, lo: int | None = None, hi: int | None = None) -> int | None:
        return None if self.obj.get(name) is None else self.int(name, lo=lo, hi=hi)

    def number(self, name: str, *, lo: float | None = None, hi: float | None = None, default: Any = _MISSING) -> float:
        v = self._get(name, default)
        if v is default and name not in self.obj:
            return v
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or (lo is not None and v < lo)
            or (hi is not None and v > hi)
        ):
            raise self.fail(name, f"a number in [{lo}, {hi}]", v)
        return float(v)

    def str(self, name: str, *, choices: tuple[str, ...] | None = None, default: Any = _MISSING) -> str:
        v = self._get(name, default)
        if v is default and name not in self.obj:
            return v
        if not isinstance(v, str) or (choices is not None and v not in choices):
            raise self.fail(name, f"one of {', '.join(choices)}" if choices else "a string", v)
        return v

    def sha256(self, name: str) -> str:
        v = self.str(name)
        if len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise self.fail(name, "a sha256 digest (64 lowercase hex digits)", v)
        return v

    def filename(self, name: str) -> str:
        """A plain file name inside the folder (no separators, not . or ..)."""
        v = self.str(name)
        if not v or v in (".", "..") or Path(v).name != v or "\\" in v or "\0" in v:
            raise self.fail(name, "a file name inside the folder", v)
        return v

    def bool(self, name: str, *, default: Any = _MISSING) -> bool:
        v = self._get(name, default)
        if v is default and name not in self.obj:
            return v
        if not isinstance(v, bool):
            raise self.fail(name, "true or false", v)
        return v

    def list(self, name: str, *, default: Any = _MISSING) -> list:
        v = self._get(name, default)
        if not isinstance(v, list):
            raise self.fail(name, "a list", v)
        return v

    def int_list(
        self, name: str, *, lo: int | None = None, hi: int | None = None, default: Any = _MISSING
    ) -> list[int]:
        v = self.list(name, default=default)
        bad = [
            x
            for x in v
            if isinstance(x, bool)
            or not isinstance(x, int)
            or (lo is not None and x < lo)
            or (hi is not None and x > hi)
        ]
        if bad:
            raise self.fail(name, f"a list of integers in [{lo}, {hi}]", bad[0])
        return v

    def str_list(self, name: str, *, default: Any = _MISSING) -> list[str]:
        v = self.list(name, default=default)
        bad = [x for x in v if not isinstance(x, str)]
        if bad:
            raise self.fail(name, "a list of strings", bad[0])
        return v

    def dict(self, name: str, *, default: Any = _MISSING) -> dict:
        v = self._get(name, default)
        if not isinstance(v, dict):
            raise self.fail(name, "a JSON object", v)
        return v

    def sub(self, name: str, *, default: Any = _MISSING) -> Fields:
        return Fields(
            self.dict(name, default=default),
            where=self.where,
            error=self.error,
            fix=self.fix,
            prefix=f"{self.prefix}{name}.",
        )


def read_fields(path: str | Path, *, error: ErrorType, what: str, fix: str, limit: int = SMALL_JSON) -> Fields:
    """A JSON object file, read and parsed with the checks above, for typed field reads."""
    obj = read_json(path, error=error, what=what, fix=fix, limit=limit)
    return Fields(obj, where=str(path), error=error, fix=fix)


def check_vocab_fits(*, tokenizer_size: int, model_width: int, tokenizer: str, model: str) -> None:
    """A tokenizer must spell every id the model can emit and the model must score every id the
    tokenizer can produce; only a few padding rows past the tokenizer are normal."""
    fix = f"put {model}'s own tokenizer.json beside it"
    if tokenizer_size > model_width:
        raise TokenizerError(
            f"{tokenizer} has {tokenizer_size} tokens but {model} scores only {model_width}: "
            f"the tokenizer belongs to another model; {fix}"
        )
    rows, share = VOCAB_PADDING
    if model_width - tokenizer_size > max(rows, int(share * model_width)):
        raise TokenizerError(
            f"{model} scores {model_width} tokens but {tokenizer} spells only {tokenizer_size}: ids "
            f"{tokenizer_size}..{model_width - 1} would vanish from the text, so the tokenizer belongs to another model; {fix}"
        )


_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2}
_DTYPE_BYTES |= {"I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def check_safetensors(path: str | Path, *, error: ErrorType, fix: str) -> None:
    """Refuse a truncated or damaged .safetensors file from its header alone (no tensor is read):
    the header must parse and its tensors must cover the data section exactly."""
    what = "weights file"
    st = check_regular(path, error=error, what=what, fix=fix)
    size = st.st_size
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 2 <= n <= min(100 * MiB, size - 8):
                raise error(
                    f"{what} {path} is truncated or not safetensors ({show_size(size)}, no complete header); {fix}"
                )
            header = f.read(n)
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None
    meta = parse_json(header, error=error, where=f"the header of {what} {path}", fix=fix, depth=4)
    if not isinstance(meta, dict):
        raise error(f"{what} {path} has a damaged header; {fix}")
    end = 0
    for name, t in meta.items():
        if name == "__metadata__":
            continue
        try:
            a, b = t["data_offsets"]
            count = 1
            for d in t["shape"]:
                if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                    raise TypeError
                count *= d
            width = _DTYPE_BYTES.get(t["dtype"])
            ok = isinstance(a, int) and isinstance(b, int) and 0 <= a <= b and (width is None or b - a == count * width)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise error(f"{what} {path} has a damaged header entry for tensor {name!r}; {fix}")
        end = max(end, b)
    if 8 + n + end != size:
        state = "truncated" if 8 + n + end > size else "damaged"
        raise error(
            f"{what} {path} is {state}: its header describes {show_size(8 + n + end)} but the file has "
            f"{show_size(size)}; {fix}"
        )
