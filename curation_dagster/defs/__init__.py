"""The Dagster definitions: the code locations, one asset per program and its checks, the
partitions, the ``curation`` resource, recrawls, and the launchers a partition runs through."""
