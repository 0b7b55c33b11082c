"""What a worker process of ``stages.parallel.map_ordered`` starts with: the modules every worker
would otherwise import itself (pyarrow imports pandas at its first conversion of Python objects,
0.2-0.3 s of CPU a process), imported once in the process that forks the workers."""

from __future__ import annotations

import subprocess
import sys

# A fresh interpreter (pytest's own has imported pandas long ago): the workers report whether
# pandas was loaded when their first item came, before anything in them could import it.
CHILD = """
import sys
from stages.parallel import map_ordered
from stages.params import ExecutionParams
assert "pandas" not in sys.modules
print(list(map_ordered(eval, ["'pandas' in __import__('sys').modules"] * 4, ExecutionParams(workers=2))))
"""


def test_forked_workers_inherit_what_pyarrow_would_import_in_each() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[True, True, True, True]"
