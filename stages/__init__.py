"""Stage programs of curation-dagster: pure data programs with no Dagster dependency."""
