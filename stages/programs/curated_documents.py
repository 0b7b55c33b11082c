"""curated_documents[source, crawl]: the output, raw documents minus every removal list."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from stages.catalog import PROGRAMS, STAGES
from stages.params import CuratedDocumentsParams, ExecutionParams
from stages.programs.raw_documents import DOCUMENTS
from stages.removal import removal_lists, survivors
from stages.reports import CuratedDocumentsReport, RawDocumentsReport, read_as
from stages.store import FINAL_COMPRESSION, PartitionWriter
from stages.task import Inputs, Partition


def removed_per_stage(removed: dict[str, pa.Array]) -> dict[str, int]:
    """Documents removed by each stage, of a source's removal lists (``removal_lists``, in
    pipeline order); a document counts for the first stage only."""
    seen = pa.array([], pa.string())
    counts: dict[str, int] = {}
    for program, ids in removed.items():
        if len(seen):
            ids = ids.filter(pc.invert(pc.is_in(ids, value_set=seen)))
        stage = PROGRAMS[program].stage
        assert stage is not None
        counts[stage] = len(pc.unique(ids))
        seen = pa.concat_arrays([seen, ids])
    return counts


def run(
    params: CuratedDocumentsParams,
    inputs: Inputs,
    output: PartitionWriter,
    partition: Partition,
    execution: ExecutionParams,
) -> CuratedDocumentsReport:
    """Report: input, kept, quarantined, removed and removed per stage (input = kept + quarantined + removed)."""
    assert partition.source is not None
    output.compression = FINAL_COMPRESSION  # the crawl's output: kept and shipped, so compact
    kept = 0
    removed = removal_lists(inputs, partition.source)  # read once, for the survivors and the counts
    for table in survivors(inputs, partition.source, None, execution.batch_rows, progress=partition.progress,
                           removed=removed):
        output.write("documents", table)
        kept += table.num_rows
    if kept == 0:
        output.write("documents", DOCUMENTS.empty_table())
    raw = read_as(inputs.manifest("raw_documents", partition.source), RawDocumentsReport)
    # Every stage, in pipeline order: one the crawl switched off has no list, and removed none.
    per_stage = {stage: 0 for stage in STAGES} | removed_per_stage(removed)
    return CuratedDocumentsReport(input=raw.input, kept=kept, quarantined=raw.quarantined,
                                  removed=sum(per_stage.values()), removed_per_stage=per_stage)
