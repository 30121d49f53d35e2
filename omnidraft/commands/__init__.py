"""Subcommands of the `omnidraft` CLI, discovered by omnidraft.cli (one module each)."""

import os


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
