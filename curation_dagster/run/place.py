"""Where a crawl's partitions are read, written and judged, as the code that runs and describes
them needs it (``Curation``): the ``curation`` resource, or in a warm pool's worker, which
imports no Dagster, a ``Place`` made of the resource's settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from stages.dataroot import DataRoot
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

    def dataroot(self) -> DataRoot:
        return DataRoot.open(self.data_root, self.workdir, self.storage_options)

    def store(self) -> Store:
        return self.dataroot().store
