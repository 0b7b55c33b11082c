"""GPU twins (stages/kernels/gpu) against the CPU kernels: integer outputs equal bit for bit.

Every twin runs on torch device "cpu" here (the same code path as on CUDA); the same tests run on
"cuda" under the ``gpu`` marker (bench/gpu_check.sh). The whole fuzzy chain runs once on the CPU
kernels and once on the twins ($CURATE_GPU_DEVICE=cpu) and must write identical tables.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stages import backend as B
from stages.kernels import lsh
from stages.kernels import minhash as mh

torch = pytest.importorskip("torch")
from stages.kernels.gpu import lsh as glsh  # noqa: E402
from stages.kernels.gpu import minhash as gmh  # noqa: E402

CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
)
DEVICES = ["cpu", CUDA]
PROPS = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
# Unicode without surrogates (a str with one cannot come from UTF-8 input), emoji made likely.
EMOJI = st.sampled_from(["😀", "👍🏽", "🇫🇷", "👩‍👩‍👧", "🎉", "\u200d", "é", "ß", "中", "\x00"])
TEXT = st.lists(st.one_of(st.characters(exclude_categories=["Cs"]), EMOJI), max_size=60).map("".join)


# --- MinHash ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_planted_signature_values(device: str) -> None:
    texts = ["", "a", "é", "😀" * 30, "x" * 23, "x" * 24, "x" * 25, "\x00\x00"]
    got = gmh.signatures(texts, device=device, num_perm=9, shingle=24)
    assert np.array_equal(got, mh.signatures(texts, num_perm=9, shingle=24))
    assert (got[0] == mh.EMPTY).all()  # empty text: every entry 0xFFFFFFFF
    # 25 x's hold the one shingle of 24 x's twice (the same set); 23 x's are one shorter shingle
    assert np.array_equal(got[5], got[6]) and not np.array_equal(got[4], got[5])
    # the same texts through a raw batch of invalid UTF-8: stray continuation, truncated and
    # overlong sequences, 0xFF, a truncated 4-byte sequence at a document's end
    raw = b"\xe0\x80\xc0\x80abc\xff\xf0\x9f\x98\x80\xf0\x9f\x98\xc3\xa9zz\xed\xa0\x80\xf0\x9f"
    batch = mh.Utf8Batch(np.frombuffer(raw, np.uint8), np.array([0, 4, 8, 15, 20, 23, len(raw)], np.int64))
    assert np.array_equal(gmh.signatures(batch, shingle=2, device=device), mh.signatures(batch, shingle=2))
    h, ns = gmh.shingle_hashes(batch, shingle=2, device=device)
    offs = batch.offsets
    ref = [mh._doc_shingle_hashes(batch.data, offs[i], offs[i + 1], 2) for i in range(len(batch))]
    assert ns.tolist() == [len(r) for r in ref] == [2, 3, 3, 3, 2, 1]
    cps, counts = gmh.code_points(torch.from_numpy(batch.data.copy()), torch.from_numpy(np.diff(batch.offsets)))
    r = 0xFFFD
    assert counts.tolist() == [3, 4, 4, 4, 3, 1]
    assert cps.tolist() == [r, r, 0, 0x61, 0x62, 0x63, r, 0x1F600, r, r, r, 0xE9, 0x7A, 0x7A, r, r, r, r, r]
    assert np.array_equal(h, np.concatenate(ref))


@pytest.mark.parametrize("device", DEVICES)
@PROPS
@given(texts=st.lists(TEXT, max_size=6), shingle=st.integers(1, 30), num_perm=st.integers(1, 40),
       seed=st.integers(0, 2**64 - 1))
def test_signatures_equal_on_generated_unicode(
    device: str, texts: list[str], shingle: int, num_perm: int, seed: int
) -> None:
    ref = mh.signatures(texts, shingle=shingle, num_perm=num_perm, seed=seed)
    got = gmh.signatures(texts, shingle=shingle, num_perm=num_perm, seed=seed, device=device, chunk_bytes=64)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("device", DEVICES)
@PROPS
@given(docs=st.lists(st.binary(max_size=40), max_size=6), shingle=st.integers(1, 6))
def test_shingle_hashes_equal_on_arbitrary_bytes(device: str, docs: list[bytes], shingle: int) -> None:
    """Any bytes at all, valid UTF-8 or not: the twin decodes exactly as the numba decoder does."""
    offsets = np.zeros(len(docs) + 1, np.int64)
    np.cumsum([len(d) for d in docs], out=offsets[1:])
    batch = mh.Utf8Batch(np.frombuffer(b"".join(docs), np.uint8), offsets)
    h, ns = gmh.shingle_hashes(batch, shingle=shingle, device=device, chunk_bytes=16)
    ref = [mh._doc_shingle_hashes(batch.data, offsets[i], offsets[i + 1], shingle) for i in range(len(docs))]
    assert ns.tolist() == [len(r) for r in ref]
    assert np.array_equal(h, np.concatenate([np.zeros(0, np.uint64), *ref]))
    assert np.array_equal(gmh.signatures(batch, shingle=shingle, num_perm=5, device=device),
                          mh.signatures(batch, shingle=shingle, num_perm=5))


def test_powers_and_fmix_match_python_integers() -> None:
    base = mh.ROLL_BASE
    got = gmh.powers(base, 37, "cpu").numpy().view(np.uint64)
    assert [int(v) for v in got] == [pow(base, t, 1 << 64) for t in range(37)]
    inv = pow(base, -1, 1 << 64)
    assert (base * inv) % (1 << 64) == 1
    values = [0, 1, 2**63, 2**64 - 1, 0x0123456789ABCDEF]
    h = gmh.fmix64(torch.tensor([gmh.s64(v) for v in values])).numpy().view(np.uint64)
    m = (1 << 64) - 1

    def fmix(x: int) -> int:
        x ^= x >> 33
        x = (x * 0xFF51AFD7ED558CCD) & m
        x ^= x >> 33
        x = (x * 0xC4CEB9FE1A85EC53) & m
        return x ^ (x >> 33)

    assert [int(v) for v in h] == [fmix(v) for v in values]


# --- LSH --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@PROPS
@given(data=st.data(), n=st.integers(0, 60))
def test_band_edges_equal_on_colliding_keys(device: str, data: st.DataObject, n: int) -> None:
    """Few distinct keys (many buckets of several members), half of them >= 2**63: the twin must
    order them as uint64, not int64."""
    alphabet = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 0xDEADBEEF << 32]
    keys = np.array(data.draw(st.lists(st.sampled_from(alphabet), min_size=n, max_size=n)), dtype=np.uint64)
    ids = np.array(data.draw(st.permutations(range(0, 3 * n, 3))), dtype=np.int64)
    src, dst, stats = lsh.band_edges(keys, ids, top=3)
    tsrc, tdst, tstats = glsh.band_edges(keys, ids, top=3, device=device)
    assert np.array_equal(tsrc, src) and np.array_equal(tdst, dst)
    assert tstats.as_dict() == stats.as_dict()


@PROPS
@given(sigs=st.integers(1, 30).flatmap(
    lambda n: st.lists(st.lists(st.integers(0, 2**32 - 1), min_size=12, max_size=12), min_size=n, max_size=n)),
    bands=st.integers(1, 4), rows=st.integers(1, 3))
def test_band_keys_equal_on_generated_signatures(sigs: list[list[int]], bands: int, rows: int) -> None:
    arr = np.array(sigs, dtype=np.uint32)
    assert np.array_equal(glsh.band_keys(arr, bands, rows, device="cpu"), lsh.band_keys(arr, bands, rows))


@pytest.mark.parametrize("device", DEVICES)
@PROPS
@given(data=st.data(), n=st.integers(1, 80))
def test_components_equal_on_generated_graphs(device: str, data: st.DataObject, n: int) -> None:
    edges = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=120))
    src = np.array([e[0] for e in edges], np.int64)
    dst = np.array([e[1] for e in edges], np.int64)
    assert np.array_equal(glsh.connected_components(n, src, dst, device=device), lsh.connected_components(n, src, dst))


@pytest.mark.parametrize("device", DEVICES)
def test_components_planted_shapes(device: str) -> None:
    n = 4000
    path = np.arange(n - 1, dtype=np.int64)[::-1].copy()  # a long chain, listed from its far end
    assert (glsh.connected_components(n, path + 1, path, device=device) == 0).all()
    star = np.full(n - 1, n - 1, np.int64)  # everything hangs on the last node
    assert (glsh.connected_components(n, star, np.arange(n - 1), device=device) == 0).all()
    labels = glsh.connected_components(6, np.array([5, 3, 4]), np.array([4, 3, 2]), device=device)
    assert labels.tolist() == [0, 1, 2, 3, 2, 2]
    assert glsh.connected_components(0, np.zeros(0, np.int64), np.zeros(0, np.int64), device=device).shape == (0,)


# --- backend selection and the whole fuzzy chain ------------------------------------------------------------


def test_resolve_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(B.GPU_DEVICE_ENV, raising=False)
    assert B.resolve("cpu") == B.CPU
    if not torch.cuda.is_available():
        assert B.resolve("auto") == B.CPU
        with pytest.raises(B.BackendUnavailable, match="no CUDA device"):
            B.resolve("gpu")
    else:
        assert B.resolve("auto") == B.Backend("gpu", "cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        B.resolve("tpu")
    monkeypatch.setenv(B.GPU_DEVICE_ENV, "cpu")
    assert B.resolve("gpu") == B.resolve("auto") == B.Backend("gpu-twin-on-cpu", "cpu")
    assert B.resolve("cpu") == B.CPU  # an explicit cpu stays on the CPU kernels
    assert B.reported({"device": "cuda:0"}) == "gpu" and B.reported({}) == "cpu"


def test_gpu_package_and_backend_import_no_torch() -> None:
    """The twins' package and the backend switch load on a machine without torch or CUDA."""
    import subprocess
    import sys

    code = ("import sys, stages.kernels.gpu, stages.backend, stages.execute; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_auto_without_a_gpu_driver_imports_no_torch() -> None:
    """``auto`` on a machine with no GPU driver (or every device hidden) resolves to the CPU
    without importing torch: that import costs ~1.3 s in every stage process."""
    import os
    import subprocess
    import sys

    code = ("import sys, stages.backend as B; {patch}; "
            "assert B.resolve('auto') == B.CPU and not B.gpu_driver_present(); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", B.GPU_DEVICE_ENV)}
    no_driver = code.format(patch="B.DRIVER_PATHS = ('/nonexistent/nvidia',)")
    assert subprocess.run([sys.executable, "-c", no_driver], env=env).returncode == 0
    for hidden in ("", "-1"):
        assert subprocess.run([sys.executable, "-c", code.format(patch="pass")],
                              env={**env, "CUDA_VISIBLE_DEVICES": hidden}).returncode == 0
