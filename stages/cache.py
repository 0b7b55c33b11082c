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
a cache: the output is the same). A save is append-only: the rows added go into new part files
and the new manifest names the old parts and the new ones, so saving costs what was added, not
the whole cache (every ``MAX_PARTS`` saves the parts are compacted into one rewrite, so a read
stays a few files). A key is never stored twice: rows another attempt saved meanwhile are read
under the lock and the added rows they already hold are left out.
"""

from __future__ import annotations

import hashlib

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from stages.store import Manifest, PartitionBusy, Store

MAX_PARTS = 64  # part files a cache may have before a save compacts them into one rewrite


def text_keys(texts: list[str]) -> pa.Array:
    """fixed_size_binary(16): xxh3-128 of each text's UTF-8 (the row key of a content cache)."""
    return pa.array(
        [xxhash.xxh3_128_digest(t.encode("utf-8", "surrogatepass")) for t in texts], pa.binary(16)
    )


class RowCache:
    """Computed rows of one ``kind`` and ``ident`` for one partition, by ``key_column``.

    ``schema`` is the row layout (the key column included). ``find`` says where each key is in
    the content read at start (``take`` returns those rows), ``add`` appends computed rows, and
    ``save`` commits the added rows as new parts beside the old ones.
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
        manifest = store.read_manifest(self.dir)
        self.exists = manifest is not None
        # The part files ``table`` holds: the content read here, to which a save appends.
        self._parts: list[str] = list(manifest.tables.get(table, [])) if manifest is not None else []
        content = store.read_parts(self.dir, self._parts) if self._parts else schema.empty_table()
        # Content in another layout is not this cache's (the layout is part of the code version
        # in ``ident``; this guards against a folder copied by hand): it is replaced at ``save``.
        self._replace = not content.schema.equals(schema)
        if self._replace:
            content, self.exists, self._parts = schema.empty_table(), False, []
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

    def save(self, batch_rows: int = 100_000, compression: str = "auto") -> bool:
        """Commit the added rows as new parts beside the old ones (or the empty cache, when none
        existed); False when nothing was written (nothing new, or another attempt holds the
        cache's lock). Rows saved by another attempt since this cache was read are adopted, and
        the added rows whose keys they hold are left out. ``compression``: the parts' codec, as
        the execution's ``intermediate_compression`` names it (``stages.store.intermediate_compression``)."""
        if not self._added and self.exists:
            return False
        try:
            writer = self.store.writer(self.dir, compression)
        except PartitionBusy:  # another attempt is saving this cache right now; it is only a cache
            return False
        try:
            current = self.store.read_manifest(self.dir)  # under the lock: what is committed now
            parts = [] if current is None or self._replace else list(current.tables.get(self.table_name, []))
            if not parts:  # no cache (or one in another layout, replaced): this content is all
                theirs, old = self.schema.empty_table(), self.table
            elif parts[:len(self._parts)] == self._parts:  # appended to meanwhile, or not at all
                theirs = self._read_new(parts[len(self._parts):])
                old = pa.concat_tables([self.table, theirs]) if theirs.num_rows else self.table
            else:  # compacted by another attempt since this cache was read: its content is current
                theirs = old = self._read_new(parts)
            added = self._without_keys(
                pa.concat_tables(self._added) if self._added else self.schema.empty_table(), theirs)
            if not parts or len(parts) >= MAX_PARTS:  # a new cache, or a compaction: rewrite
                table = pa.concat_tables([old, added])
                if table.num_rows == 0:
                    writer.write(self.table_name, table)
                for start in range(0, table.num_rows, batch_rows):
                    writer.write(self.table_name, table.slice(start, batch_rows))
            else:  # append: the old parts stay, the added rows become new parts
                assert current is not None
                writer.tables[self.table_name] = list(parts)
                writer.rows[self.table_name] = current.rows.get(self.table_name, old.num_rows)
                for start in range(0, added.num_rows, batch_rows):
                    writer.write(self.table_name, added.slice(start, batch_rows))
            names = list(writer.tables[self.table_name])
            writer.commit(Manifest(self.kind, self.key, self.key, self.crawl, self.source, {"cache": self.ident}))
        except PartitionBusy:  # on S3, the lease was taken over meanwhile: the taker saves it
            return False
        finally:
            writer.close()
        self.table, self._parts, self._added, self._added_keys, self.exists, self._replace = (
            pa.concat_tables([old, added]).combine_chunks(), names, [], set(), True, False)
        self._index = self.table[self.key_column].combine_chunks()
        return True

    def _read_new(self, names: list[str]) -> pa.Table:
        """Rows of parts another attempt committed since this cache was read, in its layout."""
        if not names:
            return self.schema.empty_table()
        return self.store.read_parts(self.dir, names).select(self.schema.names).cast(self.schema)

    def _without_keys(self, rows: pa.Table, other: pa.Table) -> pa.Table:
        """``rows`` whose key ``other`` does not hold."""
        if other.num_rows == 0 or rows.num_rows == 0:
            return rows
        held = pc.is_in(rows[self.key_column], value_set=other[self.key_column].combine_chunks())
        return rows.filter(pc.invert(held))
