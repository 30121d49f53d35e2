"""Native libraries' stderr lines are dropped at the file descriptor, and nothing else is."""

import subprocess
import sys

SCRIPT = r"""
import os
from omnidraft.native_output import FirstUse, without_native_lines

with without_native_lines():
    os.write(2, b"[cpuinfo_utils.cpp:87] Failed to open midr file /sys/devices/soc0/image_version\n")
    os.write(2, b"No temp allocator provided\n")
    os.write(2, b"[kernel_runtime_context.h:91] No temp allocator provided\n")
    os.write(2, b"[threadpool.cpp:66] Resetting threadpool to 1 threads.\n")
    os.write(2, b"a real error: keep me\n")
first = FirstUse()
for _ in range(2):
    with first():
        os.write(2, b"[cpuinfo_utils.cpp:125] CPU info and manual query on # of cpus dont match.\n")
"""


def test_native_probe_lines_are_dropped_and_other_lines_kept():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, check=True)
    lines = out.stderr.decode().splitlines()
    assert "a real error: keep me" in lines
    assert not any("temp allocator" in line or "threadpool" in line for line in lines)
    # FirstUse filters the first run only: the probe prints once per process, so a later line is real
    assert [line for line in lines if "cpuinfo" in line] == [
        "[cpuinfo_utils.cpp:125] CPU info and manual query on # of cpus dont match."
    ]
