"""Where a process finds its workdir (``curate.yaml``, the embedded Dagster instance), resolved in
one place. The data root and its storage options are ``stages.dataroot.DataRoot.open``'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from curation_dagster.instance import ensure_instance_config, workdir_of

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
