"""The payload of curation-dagster: the programs: pure data programs with no Dagster dependency."""
