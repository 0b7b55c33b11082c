"""Where a crawl's partitions are read, written and judged, as the code that runs and describes
them needs it (``Curation``): the ``curation`` resource, or in a warm pool's worker, which
imports no Dagster, a ``Place`` made of the resource's settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from stages.credentials import storage_options as resolve_options
from stages.dataroot import DataRoot, data_root_url
from stages.store import Store


class Curation(Protocol):
    """The workdir (its ``curate.yaml``: the checks' bounds) and the data root."""

    @property
    def workdir(self) -> str: ...

    def dataroot(self) -> DataRoot: ...

    def store(self) -> Store: ...


@dataclass(frozen=True)
class Place:
    """A ``Curation`` from the resource's workdir, data root and storage options, resolved where
    the resource was (``CurationResource.root``, ``options``)."""

    workdir: str
    data_root: str
    storage_options: dict[str, Any] = field(default_factory=dict, repr=False)  # may hold credentials

    @classmethod
    def of(cls, workdir: str, data_root: str | None, storage_options: dict[str, Any]) -> Place:
        """The place of the ``curation`` resource's settings (``CurationResource.place``), resolved
        here: ``data_root`` else the workdir's (``stages.dataroot.data_root_url``), the options
        else ``$CURATE_STORAGE_OPTIONS``. Without Dagster: ``curate run`` starts partitions before
        it imports it."""
        return cls(workdir, data_root_url(data_root, workdir), resolve_options(storage_options))

    def dataroot(self) -> DataRoot:
        return DataRoot.open(self.data_root, self.workdir, self.storage_options)

    def store(self) -> Store:
        return self.dataroot().store
