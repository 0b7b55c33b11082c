"""Peak RSS of a subprocess, for the memory-bound tests: source of a ``peak_kib()`` function to
prepend to a ``python -c`` script.

It reads the kernel's high-water mark of the process's own memory (``VmHWM``). Not
``ru_maxrss``: Linux carries that over from the parent across fork + exec, so a child of a
pytest process that once held 1 GB reports at least 1 GB whatever it does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PEAK = """
import resource
def peak_kib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""


def bytes_per_document(script: str, timeout_s: float = 600) -> float:
    """Run ``script`` (``PEAK`` first, then a kernel on a generated input, printing ``(peak_kib()
    - base) * 1024 / documents``) in a fresh interpreter with only this checkout on the path."""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout_s,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return float(proc.stdout)
