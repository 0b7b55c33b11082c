"""Where a partition's ``python -m stages`` runs when it is not the warm pool's
(``curation_dagster.run.pool.PartitionPool``), chosen by ``CurationResource.mode``:

- :mod:`~curation_dagster.defs.launchers.pipes`: a ``python -m stages`` subprocess with the stage pod's
  command line, speaking Dagster Pipes (``curate deploy``);
- :mod:`~curation_dagster.defs.launchers.k8s`: a Kubernetes pod through dagster-k8s's ``PipesK8sClient``.

Each runs one partition and returns what it reported over Pipes (its outcome or its error); the
crawl step or asset step that launched it describes and records it. Each takes what it runs as
plain values (a command line, pod arguments), so no launcher imports the resource that picks it.
"""
