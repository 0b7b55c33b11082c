"""How one asset partition's stage program is run, chosen by ``CurationResource.mode``:

- :mod:`~curation_dagster.launchers.inprocess`: in this process (the embedded default);
- :mod:`~curation_dagster.launchers.pipes`: a ``python -m stages`` subprocess with the stage pod's
  command line, speaking Dagster Pipes (``curate deploy``);
- :mod:`~curation_dagster.launchers.k8s`: a Kubernetes pod through dagster-k8s's ``PipesK8sClient``.

Each takes what it runs as plain values (a store and spec, a command line, pod arguments), so no
launcher imports the resource that picks it.
"""
