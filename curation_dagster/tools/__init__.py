"""Questions to a crawl's outputs and helpers around them, with no Dagster: explain, lineage,
profile, semantic audit, decontam report, sample corpus, sizing (tests/curation_dagster/tools)."""
