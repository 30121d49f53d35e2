"""Native libraries' stderr lines a user cannot act on, dropped where they are raised.

ExecuTorch's threadpool probes the CPU through cpuinfo on first use and prints each probe (files
that only exist on Arm, a CPU count it disagrees with) to the process's stderr from C++, past
Python's ``sys.stderr``. ``without_native_lines`` catches file descriptor 2 for the duration of a
call and writes back every line that does not match; ``FirstUse`` does so around a call's first run
only. ExecuTorch's custom LLM ops, run eagerly as an export's reference, also note on every call that
no temp allocator was given (they need none on CPU), and resizing its threadpool announces itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

NATIVE = re.compile(
    rb"^(\[cpuinfo_utils\.cpp:\d+\]|\[threadpool\.cpp:\d+\] Resetting threadpool"
    rb"|(\[kernel_runtime_context\.h:\d+\] )?No temp allocator provided)"
)


@contextlib.contextmanager
def without_native_lines(pattern: re.Pattern[bytes] = NATIVE) -> Iterator[None]:
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (captured, closed): nothing to filter
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().splitlines(keepends=True) if not pattern.match(line)]
            if kept:
                os.write(fd, b"".join(kept))


class FirstUse:
    """``with first_use():`` drops the native lines the first time only. For a call made once per
    decode step whose first run may start the threadpool: catching fd 2 on every step would cost each
    one a temporary file and two dup2 calls, for a probe that prints once per process."""

    def __init__(self) -> None:
        self.done = False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if self.done:
            yield
            return
        self.done = True
        with without_native_lines():
            yield
