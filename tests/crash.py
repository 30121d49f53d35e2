"""Killing a publishing process at an injected step (omnidraft.atomic.crash_point), for the tests."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from omnidraft import atomic


def killed_at(step: str, publish: Callable[[], object]) -> None:
    """Run ``publish`` in a forked child that SIGKILLs itself at ``step`` (no exception handler or
    ``finally`` runs, as with a power cut or the OOM killer); fail if it never got there."""
    pid = os.fork()
    if pid == 0:
        try:
            os.environ[atomic.CRASH_ENV] = step
            atomic._reached.clear()
            publish()
        finally:
            os._exit(3)  # only reached when the step never was
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL, f"the child never reached {step}"


def hidden(folder: Path) -> list[str]:
    """Hidden entries of ``folder``: temporary files and staging folders a killed writer left."""
    return sorted(p.name for p in Path(folder).iterdir() if p.name.startswith("."))
