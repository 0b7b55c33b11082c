"""Running a crawl: the planner (which partitions are stale), the crawl job (a step per program,
partitions fanned out to a launcher), the recorder (Dagster events), and ``curate run`` in-process."""
