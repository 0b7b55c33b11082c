"""Where a process finds its workdir (``curate.yaml``, the embedded Dagster instance), resolved in
one place. The data root and its storage options are ``stages.dataroot.DataRoot.open``'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from curation_dagster.ops.instance import ensure_instance_config, workdir_of

WORKDIR_ENV = "CURATE_WORKDIR"


def workdir_from(env: Mapping[str, str], default: str = "workdir") -> str:
    """``$CURATE_WORKDIR`` (``curate ui``, ``curate deploy`` and the Helm values set it); else the
    workdir whose instance ``$DAGSTER_HOME`` is; else ``default``, as given (maybe relative)."""
    if env.get(WORKDIR_ENV):
        return env[WORKDIR_ENV]
    home = env.get("DAGSTER_HOME")
    found = workdir_of(home) if home else None
    return str(found) if found is not None else default


def workdir_paths(workdir: str | os.PathLike[str]) -> tuple[Path, Path]:
    """A local workdir, absolute, and its Dagster instance's home (``<workdir>/dagster``, created
    with its ``dagster.yaml`` when missing)."""
    root = Path(workdir).resolve()
    return root, ensure_instance_config(root / "dagster")


# The embedded code location's name: pyproject.toml's [tool.dagster] code_location_name (what
# `dagster dev` in the repository root loads), `curate ui`'s workspace, and the origin that
# `curate run`'s runs carry, so the UI finds their job and can re-execute them.
LOCATION_NAME = "curation_dagster"
DEFINITIONS_MODULE = "curation_dagster.defs.definitions"
REPOSITORY_NAME = "__repository__"  # a Definitions object's repository
WORKSPACE_YAML = f"""# written by curate ui: the embedded code location under its own name
load_from:
  - python_module:
      module_name: {DEFINITIONS_MODULE}
      location_name: {LOCATION_NAME}
"""


def write_workspace(home: str | os.PathLike[str]) -> Path:
    """``<home>/workspace.yaml``: the workspace ``curate ui`` serves (the embedded code location)."""
    path = Path(home) / "workspace.yaml"
    if not path.exists() or path.read_text() != WORKSPACE_YAML:
        path.write_text(WORKSPACE_YAML)
    return path


def run_origin(job_name: str) -> object:
    """The ``RemoteJobOrigin`` of ``job_name`` in the embedded code location: what a run launched
    through a code location carries, and what the UI matches a run's job by."""
    from dagster._core.remote_origin import (
        ManagedGrpcPythonEnvCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    location = ManagedGrpcPythonEnvCodeLocationOrigin(
        LoadableTargetOrigin(module_name=DEFINITIONS_MODULE, working_directory=os.getcwd()), LOCATION_NAME)
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, REPOSITORY_NAME), job_name)
