"""Content caches: values an expensive program computed, kept so that a re-keyed partition
recomputes only the rows it has never computed.

A program's output is keyed by its parameters and its inputs' keys, so a changed dedup
threshold upstream re-keys everything below it; the values behind a decision (a document's
scores, its embedding) usually did not change. Such values live in a ``RowCache``: one
partition under the data root, ``<root>/<kind>/<key>/<crawl>/<source>``, one row per row key
(a doc_id, or the hash of the text a model reads). ``key`` hashes ``ident``, which names
everything the values depend on besides the row key: the code's version, the model's content
fingerprint, its precision. So a changed model or format is a new cache and is never served
another model's values, and a decision parameter (a threshold, a survivor set) is no part of
it.

A cache is written like any output (``PartitionWriter``: attempt-unique parts, the manifest
last, the partition lock of ``stages.store``), so a reader sees its old content or its new one,
never half of it; a cache whose lock another attempt holds is not saved this time (it is only
a cache: the output is the same).
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from stages.store import Manifest, PartitionBusy, Store


def text_keys(texts: list[str]) -> pa.Array:
    """fixed_size_binary(16): xxh3-128 of each text's UTF-8 (the row key of a content cache)."""
    return pa.array(
        [xxhash.xxh3_128_digest(t.encode("utf-8", "surrogatepass")) for t in texts], pa.binary(16)
    )


class RowCache:
    """Computed rows of one ``kind`` and ``ident`` for one partition, by ``key_column``.

    ``schema`` is the row layout (the key column included). ``find`` says where each key is in
    the content read at start (``take`` returns those rows), ``add`` appends computed rows, and
    ``save`` commits old + added rows as the cache's new content.
    """

    def __init__(
        self, store: Store, kind: str, ident: str, crawl: str, source: str | None, schema: pa.Schema,
        key_column: str = "doc_id", table: str = "values",
    ) -> None:
        self.store = store
        self.kind = kind
        self.ident = ident
        self.crawl = crawl
        self.source = source
        self.schema = schema
        self.key_column = key_column
        self.table_name = table
        self.key = hashlib.sha256(ident.encode()).hexdigest()[:16]
        self.dir = store.partition_dir(kind, self.key, crawl, source)
        self.exists = store.read_manifest(self.dir) is not None
        content = store.read_table(self.dir, table) if self.exists else schema.empty_table()
        # Content in another layout is not this cache's (the layout is part of the code version
        # in ``ident``; this guards against a folder copied by hand): it is replaced at ``save``.
        if not content.schema.equals(schema):
            content, self.exists = schema.empty_table(), False
        self.table = content.combine_chunks()
        self._index = self.table[key_column].combine_chunks()
        self._added: list[pa.Table] = []
        self._added_keys: set[object] = set()

    def find(self, keys: pa.Array) -> npt.NDArray[np.int64]:
        """int64 (n,): the row of each key in the content read at start, -1 where it has none."""
        if len(keys) == 0:
            return np.zeros(0, np.int64)
        pos = pc.fill_null(pc.index_in(keys, value_set=self._index), -1)
        return np.asarray(pos.to_numpy(zero_copy_only=False), dtype=np.int64)

    def take(self, positions: npt.NDArray[np.int64]) -> pa.Table:
        """Rows at ``positions`` (from ``find``, none -1)."""
        return self.table.take(pa.array(positions, pa.int64()))

    def add(self, rows: pa.Table) -> None:
        """Append computed rows (the ``schema``'s columns, keys missing from the content read at
        start); a key added before in this run (a text repeated in two batches) is kept once."""
        keys = rows[self.key_column].to_pylist()
        new = []
        for k in keys:  # also a key twice in this call: its first row
            new.append(k not in self._added_keys)
            self._added_keys.add(k)
        if any(new):
            self._added.append(rows.select(self.schema.names).cast(self.schema).filter(pa.array(new)))

    @property
    def added(self) -> int:
        return sum(t.num_rows for t in self._added)

    def content(self) -> pa.Table:
        """Old + added rows, in that order."""
        return pa.concat_tables([self.table, *self._added]) if self._added else self.table

    def save(self, batch_rows: int = 100_000) -> bool:
        """Commit old + added rows (when rows were added, or no cache existed); False when
        nothing was written (nothing new, or another attempt holds the cache's lock)."""
        if not self._added and self.exists:
            return False
        table = self.content()
        try:
            writer = self.store.writer(self.dir)
        except PartitionBusy:  # another attempt is saving this cache right now; it is only a cache
            return False
        try:
            if table.num_rows == 0:
                writer.write(self.table_name, table)
            for start in range(0, table.num_rows, batch_rows):
                writer.write(self.table_name, table.slice(start, batch_rows))
            writer.commit(Manifest(self.kind, self.key, self.key, self.crawl, self.source, {"cache": self.ident}))
        except PartitionBusy:  # on S3, the lease was taken over meanwhile: the taker saves it
            return False
        finally:
            writer.close()
        self.table, self._added, self._added_keys, self.exists = table.combine_chunks(), [], set(), True
        self._index = self.table[self.key_column].combine_chunks()
        return True
