"""Which kernels run a program: the CPU reference (numba/scipy) or the torch twins (docs/gpu.md).

``ExecutionParams.backend`` asks; ``resolve`` answers where the program runs (in its process or
pod, not where it was planned):

* ``cpu``: the CPU kernels.
* ``gpu``: the torch twins on CUDA; an error when torch sees no CUDA device.
* ``auto``: ``gpu`` when torch is installed and sees a CUDA device, else ``cpu``.

``$CURATE_GPU_DEVICE`` (tests and debugging only) sends ``gpu`` and ``auto`` to the torch twins on
the torch device it names: ``cpu`` runs the GPU code path on the CPU (backend name
``gpu-twin-on-cpu``), which is how CI proves the whole fuzzy chain gives the same removals.

The backend is an execution setting, never part of a params key: CPU and GPU outputs share their
paths, so every integer output of a twin is bit-identical to the CPU kernel's (tests/stages/kernels/test_gpu_parity.py).
Programs record the backend they used as ``report["backend"]``; it reaches every
materialization's metadata (``stages.execute.metadata``). Nothing here imports torch until a
twin runs or ``auto`` has to look for a GPU on a machine with a GPU driver.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from stages.parallel import CallResources, kernel_cpus
from stages.params import ExecutionParams

GPU_DEVICE_ENV = "CURATE_GPU_DEVICE"
BACKENDS = ("auto", "cpu", "gpu")


class BackendUnavailable(ValueError):
    """``gpu`` was asked for on a machine where torch sees no CUDA device."""


@dataclass(frozen=True)
class Backend:
    """A resolved backend: ``name`` goes into reports; ``device`` is the torch device of the twins
    and of the programs that are torch code on every backend (semantic dedup, model classifiers)."""

    name: Literal["cpu", "gpu", "gpu-twin-on-cpu"]
    device: str = "cpu"

    @property
    def uses_torch(self) -> bool:
        return self.name != "cpu"


CPU = Backend("cpu")


# Where a GPU driver shows itself: NVIDIA's kernel module (also in containers), WSL2's GPU
# paravirtualisation, or ROCm's (torch.cuda covers them all).
DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def gpu_driver_present() -> bool:
    """A GPU driver is loaded and ``CUDA_VISIBLE_DEVICES`` does not hide every device. Without
    one torch cannot see a device, so ``auto`` need not import torch (~1.3 s per process)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return any(os.path.exists(p) for p in DRIVER_PATHS)


@lru_cache(maxsize=1)
def cuda_available() -> bool:
    """torch is installed and sees a CUDA device (imports torch once, only if it is installed
    and a GPU driver is present)."""
    if not gpu_driver_present() or importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def resolve(requested: str) -> Backend:
    """The backend a program runs on for ``ExecutionParams.backend == requested``."""
    if requested not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {requested!r}")
    if requested == "cpu":
        return CPU
    forced = os.environ.get(GPU_DEVICE_ENV, "").strip()
    if forced:
        return Backend("gpu-twin-on-cpu" if forced.split(":")[0] == "cpu" else "gpu", forced)
    if cuda_available():
        return Backend("gpu", "cuda")
    if requested == "gpu":
        raise BackendUnavailable("backend 'gpu' asked for, but torch sees no CUDA device "
                                 "(install the 'gpu' extra on a machine with one, or use --backend auto/cpu)")
    return CPU


def reported(report: dict[str, Any]) -> str:
    """The backend a report says its program used: its ``backend``, else from a torch ``device``
    it names (the semantic programs), else ``cpu``."""
    if "backend" in report:
        return str(report["backend"])
    return "gpu" if str(report.get("device", "")).startswith("cuda") else "cpu"


def fanout(backend: Backend, execution: ExecutionParams, num_cpus: float = 1.0) -> CallResources:
    """``stages.parallel`` resources of one call: ``num_cpus`` for a CPU kernel; for a twin the
    whole machine locally (calls run one at a time in this process, which owns the device: no
    forked worker may touch an initialised CUDA context) and one GPU per Ray task."""
    if not backend.uses_torch:
        return {"num_cpus": num_cpus}
    return {"num_cpus": kernel_cpus(execution), "num_gpus": 1.0 if backend.name == "gpu" else 0.0}


# --- one call per kernel, on the resolved backend ------------------------------------------------------


def signatures_on(backend: Backend, docs: Any, *, shingle: int, num_perm: int, seed: int) -> npt.NDArray[np.uint32]:
    """``stages.kernels.minhash.signatures`` or its torch twin: uint32 (n, num_perm)."""
    if backend.uses_torch:
        from stages.kernels.gpu.minhash import signatures as twin

        return twin(docs, shingle=shingle, num_perm=num_perm, seed=seed, device=backend.device)
    from stages.kernels.minhash import signatures

    return signatures(docs, shingle=shingle, num_perm=num_perm, seed=seed)


def band_keys_on(backend: Backend, sigs: npt.NDArray[np.uint32], bands: int, rows: int) -> npt.NDArray[np.uint64]:
    """``stages.kernels.lsh.band_keys`` or its torch twin: uint64 (n, bands)."""
    if backend.uses_torch:
        from stages.kernels.gpu.lsh import band_keys as twin

        return twin(sigs, bands, rows, device=backend.device)
    from stages.kernels.lsh import band_keys

    return band_keys(sigs, bands, rows)


def band_edges_on(backend: Backend, keys: npt.NDArray[np.uint64], ids: npt.NDArray[np.int64]) -> Any:
    """``stages.kernels.lsh.band_edges`` or its torch twin: (src, dst, BucketStats)."""
    if backend.uses_torch:
        from stages.kernels.gpu.lsh import band_edges as twin

        return twin(keys, ids, device=backend.device)
    from stages.kernels.lsh import band_edges

    return band_edges(keys, ids)


def pair_jaccard_on(
    backend: Backend, docs: Any, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], *, shingle: int,
    group: npt.NDArray[np.int64] | None = None,
) -> npt.NDArray[np.float64]:
    """Exact Jaccard float64 (e,) of row pairs of ``docs``: the numba kernel or its torch twin.
    ``group``: int64 (e,) each pair's component of the pair graph, where known: how the numba
    kernel cuts its work (``stages.kernels.lsh._jaccard64``); the twin needs none."""
    if backend.uses_torch:
        from stages.kernels.gpu.lsh import pair_jaccard64

        return pair_jaccard64(docs, src, dst, shingle, device=backend.device)
    from stages.kernels.lsh import _jaccard64
    from stages.kernels.minhash import as_utf8

    return _jaccard64(as_utf8(docs), src, dst, shingle, group)


def connected_components_on(
    backend: Backend, n: int, src: npt.NDArray[np.int64] | Sequence[int], dst: npt.NDArray[np.int64] | Sequence[int]
) -> npt.NDArray[np.int64]:
    """``stages.kernels.lsh.connected_components`` or its torch twin: int64 (n,) labels."""
    if backend.uses_torch:
        from stages.kernels.gpu.lsh import connected_components as twin

        return twin(n, np.asarray(src, np.int64), np.asarray(dst, np.int64), device=backend.device)
    from stages.kernels.lsh import connected_components

    return connected_components(n, np.asarray(src, np.int64), np.asarray(dst, np.int64))
