"""Peak RSS of a subprocess, for the memory-bound tests: source of a ``peak_kib()`` function to
prepend to a ``python -c`` script.

It reads the kernel's high-water mark of the process's own memory (``VmHWM``). Not
``ru_maxrss``: Linux carries that over from the parent across fork + exec, so a child of a
pytest process that once held 1 GB reports at least 1 GB whatever it does.
"""

PEAK = """
import resource
def peak_kib():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
"""
