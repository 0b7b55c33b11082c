"""The payload of curation-dagster: one pure data program per asset, with no Dagster dependency
(only ``dagster_pipes``, lazily, at ``python -m stages``), and what they share: the catalog, the
crawl spec, resolving and executing a partition, the store and data root, the check verdicts."""
