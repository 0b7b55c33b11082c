"""Handing a task's documents from a worker process to the ingesting process through a file.

A process pool returns results pickled through a pipe: a task's 8 MB of documents copied into the
pickle, written, read back in pieces and copied out, on a thread of the ingesting process (the
partition's critical path) as much as on the worker (py-spy of one source of 78k short documents
on 2 workers: 0.28 s of the ingesting process's samples and 0.2 s of the workers' per 70 MB). A
worker forked on this machine writes the table as one uncompressed Arrow IPC file into a scratch
folder of the ingesting process's instead (``stages.scratch``), which maps it: no copy, its pages
read once, when the part is written (that partition: the ingesting process's CPU 0.38-0.42 ->
0.27-0.29 s, its wall 0.84-1.00 -> 0.72-0.76 s). Ray's tasks run elsewhere: they return tables as
they are.
"""

from __future__ import annotations

import os
import uuid
from contextlib import suppress
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from stages.ingest.records import Done
from stages.ingest.tasks import Task


class Spooling:
    """A task run in a worker, its documents written to ``folder`` (picklable: the pool sends it
    to its workers). A task whose file cannot be written (the folder's disk full) sends its
    documents through the pipe, as without a folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __call__(self, task: Task) -> Done:
        done = task.run()
        if not done.docs.num_rows:
            return done
        path = os.path.join(self.folder, f"{uuid.uuid4().hex}.arrow")
        try:
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, done.docs.schema) as writer:
                writer.write_table(done.docs)
        except (OSError, pa.ArrowException):
            with suppress(OSError):
                os.unlink(path)
            return done
        return replace(done, docs=done.docs.schema.empty_table(), spooled=path)


def unspooled(done: Done) -> Done:
    """``done`` with its documents read back from the file a worker wrote (mapped, not copied;
    read where the folder's filesystem cannot map files), which is removed (a mapping holds the
    data until the table is gone)."""
    if done.spooled is None:
        return done
    try:
        docs = pa.ipc.open_file(pa.memory_map(done.spooled)).read_all()
    except (OSError, pa.ArrowException):
        with pa.OSFile(done.spooled) as source:
            docs = pa.ipc.open_file(source).read_all()
    os.unlink(done.spooled)
    return replace(done, docs=docs, spooled=None)
