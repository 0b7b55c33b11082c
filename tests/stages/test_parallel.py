"""What a worker process of ``stages.parallel.map_ordered`` starts with: pyarrow's pandas shim
settled without pandas in the process that forks the workers (pyarrow imports pandas at its first
conversion of Python objects, 0.25 s of CPU a process, and no program uses it), and pandas known
to pyarrow again once something imports it after all; and that it is
forked from the process that calls it, wherever that process was started; and how it decodes
Parquet with the cores it was given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stages.parallel import usable_cores

# A fresh interpreter (pytest's own has imported pandas long ago): the workers convert Python
# objects, as every program does, and report whether that imported pandas.
CHILD = """
import sys
from stages.parallel import map_ordered
from stages.params import ExecutionParams
assert "pandas" not in sys.modules
probe = "(__import__('pyarrow').array(['a']), 'pandas' in __import__('sys').modules)[1]"
print(list(map_ordered(eval, [probe] * 4, ExecutionParams(workers=2))), "pandas" in sys.modules)
"""


def test_forked_workers_convert_python_objects_without_importing_pandas() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[False, False, False, False] False"


# After ``preload`` (twice: the second finds the shim settled), pandas looked up and then imported
# by anything (a plug-in filter's own import): pyarrow converts its objects as pandas objects again
# (a categorical Series is a dictionary array, not strings), and round-trips tables through pandas.
AFTER_ALL = """
import sys
import pyarrow as pa
from stages.parallel import preload
preload()
preload()
print("pandas" in sys.modules, pa.array(["a"]).type)
import importlib.util
assert importlib.util.find_spec("pandas") is not None  # "is pandas installed?": a look-up, no import
import pandas as pd
print(pa.array(pd.Series(["a", "b", "a"], dtype="category")).type.id == pa.dictionary(pa.int8(), pa.string()).id,
      pa.Table.from_pandas(pa.table({"a": [1, 2]}).to_pandas()).num_rows)
"""


def test_pandas_imported_after_all_is_pandas_to_pyarrow_again() -> None:
    out = subprocess.run([sys.executable, "-c", AFTER_ALL], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "string", "True", "2"]


# A process started by a fork server, as ``curate run``'s pool starts its workers: its default
# start method is the fork server's, whose children are not its own.
SERVED = """
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from stages.parallel import map_ordered
from stages.params import ExecutionParams


def fanned(items):
    return multiprocessing.get_start_method(), list(map_ordered(abs, items, ExecutionParams(workers=2)))


if __name__ == "__main__":
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("forkserver")) as pool:
        print(pool.submit(fanned, [-1, -2, -3, -4]).result())
"""


def test_a_process_a_fork_server_started_fans_out_on_forked_workers(tmp_path: Path) -> None:
    """Its pool's workers were its fork server's children: each ended at once (``die_with_parent``
    saw another parent) and the pool broke. Fanned out by a pool worker of ``curate run`` (a
    crawl-wide program on the pool, a source partition of a narrow pool), the partition failed."""
    script = tmp_path / "served.py"
    script.write_text(SERVED)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "('forkserver', [1, 2, 3, 4])"


def test_collector_paused_turns_the_collector_off_and_back_and_freezes_only_when_asked() -> None:
    """A fresh process: ``collector_paused`` leaves the collector off inside, on after (off where
    it was off), and moves what the process holds out of its reach only with ``freeze``."""
    probe = """
import gc
from stages.parallel import collector_paused

seen = []
with collector_paused():
    seen.append(gc.isenabled())
seen += [gc.isenabled(), gc.get_freeze_count()]
with collector_paused(freeze=True):
    junk = [[i] for i in range(1000)]
seen += [gc.isenabled(), gc.get_freeze_count() >= 1000]
gc.disable()
with collector_paused():
    pass
seen.append(gc.isenabled())
print(seen)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[False, True, 0, True, True, False]"


def test_a_process_limited_to_one_core_decodes_parquet_on_its_reading_thread(tmp_path: Path) -> None:
    """A fresh process: a Parquet read decodes on Arrow's pool (``use_threads``) where the
    process's kernels have more than one core (``limit_threads``, a Ray task's setup too; where
    never called, the cores it may run on), on the reading thread with one, whichever way the
    store reads a part (whole, in batches, a writer's own); a worker ``map_ordered`` forks decodes
    as a process of its ``num_cpus``. The rows are the same either way, and Arrow's pool keeps
    its size."""
    probe = f"""
import numba, pyarrow as pa, pyarrow.parquet as pq
from stages.parallel import _worker_setup, arrow_threads, limit_threads, map_ordered, usable_cores
from stages.params import ExecutionParams
from stages.store import Manifest, Store

asked = []
for name in ("read", "iter_batches"):
    def spy(self, *a, _real=getattr(pq.ParquetFile, name), **kw):
        asked.append(kw.get("use_threads"))
        return _real(self, *a, **kw)
    setattr(pq.ParquetFile, name, spy)

def child(_):
    return arrow_threads()

pdir = {str(tmp_path / "root" / "p")!r}
store = Store({str(tmp_path / "root")!r})
w = store.writer(pdir)
w.write("t", pa.table({{"x": list(range(5000)), "s": [str(i) * 3 for i in range(5000)]}}))
own = sum(b.num_rows for b in w.iter_batches("t", 1000))
w.commit(Manifest("p", "k", "v", "c", "s", {{}}))
pool = pa.cpu_count()
seen = [arrow_threads() == (usable_cores() > 1)]
limit_threads(2)
wide = store.read_table(pdir, "t")
seen += [arrow_threads(), list(map_ordered(child, range(4), ExecutionParams(workers=2)))]
limit_threads(1)
seen += [numba.get_num_threads(), arrow_threads(), store.read_table(pdir, "t").equals(wide),
         sum(b.num_rows for b in store.iter_batches(pdir, "t", batch_rows=1000)), own]
limit_threads(2)
_worker_setup(1, None)
seen += [arrow_threads(), pa.cpu_count() == pool, asked]
print(seen)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # the writer's own read (never limited), the read at 2 cores, the two at 1
    asked = f"[{usable_cores() > 1}, True, False, False]"
    forked = "[False, False, False, False]"  # map_ordered's workers of one core each
    assert done.stdout.strip() == f"[True, True, {forked}, 1, False, True, 5000, 5000, False, True, {asked}]"


def test_threads_run_the_items_in_this_process_side_by_side_in_input_order() -> None:
    """``threads``: the local executor's calls run on threads of this process (no fork, nothing
    pickled: a lambda will do), up to ``workers`` at once, and come back in input order however
    they finish."""
    import os
    import threading
    import time

    from stages.parallel import map_ordered
    from stages.params import ExecutionParams

    running, most = 0, 0
    lock = threading.Lock()

    def slow_first(i: int) -> tuple[int, int, int]:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05 if i == 0 else 0.01)
        with lock:
            running -= 1
        return i, os.getpid(), threading.get_ident()

    out = list(map_ordered(slow_first, range(6), ExecutionParams(workers=2), threads=True))
    assert [i for i, _, _ in out] == list(range(6))
    assert {pid for _, pid, _ in out} == {os.getpid()}
    assert threading.get_ident() not in {t for _, _, t in out} and most == 2
