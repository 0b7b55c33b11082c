"""GPU twins against the CPU kernels on real text (the sample corpus, ``curate sample``) and through a
whole fuzzy crawl: integer outputs equal bit for bit. The twins run on torch device "cpu" here; the
same tests run on "cuda" under the ``gpu`` marker (bench/gpu_check.sh).
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from curation_dagster.tools.sample import build_sample
from stages import backend as B
from stages.dataroot import CRAWLS_DIR, DataRoot
from stages.execute import execute_crawl, metadata
from stages.kernels import lsh
from stages.kernels import minhash as mh
from stages.spec import CrawlSpec
from stages.store import Store

torch = pytest.importorskip("torch")
from stages.kernels.gpu import lsh as glsh  # noqa: E402
from stages.kernels.gpu import minhash as gmh  # noqa: E402

# Parametrized like tests/stages/kernels/test_gpu_parity.py; the marker is written here, where
# bench/gpu_check.sh looks for it (the files that hold gpu-marked tests).
CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
)
DEVICES = ["cpu", CUDA]


def _sample_texts(root: Path, per_source: int) -> list[str]:
    texts: list[str] = []
    for folder in build_sample(root, max_docs_per_source=per_source).values():
        for part in sorted(folder.iterdir()):
            opener = gzip.open if part.name.endswith(".gz") else open
            with opener(part, "rt", encoding="utf-8", errors="surrogateescape") as fh:
                for line in fh:
                    try:
                        text = json.loads(line).get("text")
                    except (json.JSONDecodeError, AttributeError):
                        continue
                    if isinstance(text, str):
                        texts.append(text)
    return texts

@pytest.fixture(scope="module")
def sample_texts(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    texts = _sample_texts(tmp_path_factory.mktemp("gpu_sample"), 25)
    assert len(texts) > 60 and any(not t.isascii() for t in texts)
    return texts

@pytest.mark.parametrize("device", DEVICES)
def test_signatures_equal_on_real_text(sample_texts: list[str], device: str) -> None:
    ref = mh.signatures(sample_texts)
    assert np.array_equal(gmh.signatures(sample_texts, device=device), ref)
    # tiny chunks and tiles: many device passes, documents larger than a chunk alone
    got = gmh.signatures(sample_texts, device=device, chunk_bytes=2048, tile=1 << 17)
    assert np.array_equal(got, ref)
    for shingle, num_perm, seed in ((5, 7, 0), (1, 2, 2**64 - 1), (64, 33, 12345)):
        ref = mh.signatures(sample_texts[:30], shingle=shingle, num_perm=num_perm, seed=seed)
        got = gmh.signatures(sample_texts[:30], shingle=shingle, num_perm=num_perm, seed=seed, device=device)
        assert np.array_equal(got, ref), (shingle, num_perm, seed)

@pytest.mark.parametrize("device", DEVICES)
def test_band_keys_and_edges_equal(sample_texts: list[str], device: str) -> None:
    texts = sample_texts + [t + " (mirror)" for t in sample_texts[::3]] + ["", "", "dup", "dup"]
    sigs = mh.signatures(texts)
    for bands, rows in ((26, 10), (20, 13), (52, 5), (3, 1)):
        assert np.array_equal(glsh.band_keys(sigs, bands, rows, device=device), lsh.band_keys(sigs, bands, rows))
    keys = lsh.band_keys(sigs, 26, 10)
    ids = np.random.default_rng(3).permutation(len(texts)).astype(np.int64)
    multi = 0
    for band in range(26):
        src, dst, stats = lsh.band_edges(keys[:, band], ids)
        tsrc, tdst, tstats = glsh.band_edges(keys[:, band], ids, device=device)
        assert np.array_equal(tsrc, src) and np.array_equal(tdst, dst)
        assert tstats.as_dict() == stats.as_dict() and np.array_equal(tstats.size_hist, stats.size_hist)
        multi += stats.edges
    assert multi > 0, "the planted mirrors must share buckets"

@pytest.mark.parametrize("device", DEVICES)
def test_jaccard_and_verification_equal(sample_texts: list[str], device: str) -> None:
    rng = random.Random(5)
    base = [t for t in sample_texts if len(t) > 300][:25]
    texts = list(base)
    for t in base:  # near-duplicates at several distances, and a few exact copies
        words = t.split(" ")
        for _ in range(rng.choice([0, 1, 3, 12])):
            words[rng.randrange(len(words))] = "changed"
        texts.append(" ".join(words))
    texts += ["", "", "tiny", "tiny!"]
    batch = mh.encode_texts(texts)
    n = len(texts)
    src = np.array([rng.randrange(n) for _ in range(300)] + list(range(len(base), 2 * len(base))) + [n - 4, n - 2])
    dst = np.array([rng.randrange(n) for _ in range(300)] + list(range(len(base))) + [n - 3, n - 4])
    for shingle in (24, 5):
        ref = lsh._jaccard64(batch, src, dst, shingle)
        assert np.array_equal(glsh.pair_jaccard64(batch, src, dst, shingle, device=device), ref)
    assert ref[-2] == 1.0 and ref[-1] == 0.0  # two empty texts; empty vs. non-empty
    sigs = mh.signatures(batch)
    keys = lsh.band_keys(sigs, 26, 10)
    parts = [lsh.band_edges(keys[:, t], np.arange(n, dtype=np.int64)) for t in range(26)]
    s = np.concatenate([p[0] for p in parts])
    d = np.concatenate([p[1] for p in parts])
    band = np.concatenate([np.full(len(p[0]), t) for t, p in enumerate(parts)])
    ref_edges = lsh.verify_candidates(batch, s, d, band)
    got_edges = glsh.verify_candidates(batch, s, d, band, device=device)
    assert len(ref_edges[0]) > len(base) // 2
    for k in range(3):  # src, dst, jaccard
        assert np.array_equal(got_edges[k], ref_edges[k])

def test_backend_reaches_execution_params(tmp_path: Path) -> None:
    from curation_dagster.cli import parser
    from curation_dagster.defs.resources import CurationResource

    args = parser().parse_args(["run", "--workdir", str(tmp_path), "--crawl", "c1", "--backend", "gpu"])
    assert args.backend == "gpu"
    assert parser().parse_args(["run", "--workdir", str(tmp_path), "--crawl", "c1"]).backend == "auto"
    resource = CurationResource(workdir=str(tmp_path), backend="cpu")
    assert resource.execution().backend == "cpu"
    cmd = resource.command("minhash_signatures", "c1", "web")
    assert cmd[cmd.index("--backend") + 1] == "cpu"
    assert "--backend" not in CurationResource(workdir=str(tmp_path)).command("lsh_buckets", "c1", None)
    if not torch.cuda.is_available():  # an explicit gpu fails at once, as one line, before any partition
        from curation_dagster.cli import main

        argv = ["run", "--workdir", str(tmp_path), "--crawl", "c1", "--source", f"a={tmp_path}", "--backend", "gpu"]
        assert main(argv) == 1
        assert not (tmp_path / "data" / CRAWLS_DIR / "c1.json").exists()

@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_fuzzy_chain_on_twins_writes_identical_tables(
    device: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parquet in -> removal list out, on the CPU kernels and on the torch twins: every integer
    table equal, the removal lists identical, and the backend in each materialization's metadata."""
    from stages.params import ExecutionParams

    folders = build_sample(tmp_path / "sample", max_docs_per_source=120)
    rng = random.Random(11)
    originals = [json.loads(line) for line in (folders["docstrings"] / "part-00000.jsonl").read_text().splitlines()]
    mirror = []
    pool = [r for r in originals if len(r["text"]) > 300]
    for k, rec in enumerate(rng.sample(pool, min(25, len(pool)))):
        words = rec["text"].split(" ")
        for _ in range(rng.choice([1, 2, 4, 10])):
            words[rng.randrange(len(words))] = "mirrored"
        mirror.append({"id": f"m{k}", "text": " ".join(words)})
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mirror))
    sources = {name: {"url": str(path), "id_field": "id"} for name, path in folders.items() if name != "scraps"}
    sources["mirror"] = {"url": str(tmp_path / "mirror"), "id_field": "id"}
    spec = CrawlSpec.model_validate({"crawl": "c1", "sources": sources, "stages": ["exact", "fuzzy"]})

    monkeypatch.delenv(B.GPU_DEVICE_ENV, raising=False)
    cpu_store = Store(str(tmp_path / "cpu"))
    cpu = execute_crawl(cpu_store, spec, ExecutionParams(backend="cpu", workers=1))
    if device == "cpu":
        monkeypatch.setenv(B.GPU_DEVICE_ENV, "cpu")  # the GPU code path on the CPU
    name = "gpu-twin-on-cpu" if device == "cpu" else "gpu"
    twin_store = Store(str(tmp_path / "twin"))
    twin = execute_crawl(twin_store, spec, ExecutionParams(backend="gpu", workers=1))

    used = {prog: twin[(prog, src)].manifest.report["backend"] for prog, src in twin}
    for prog in ("minhash_signatures", "lsh_buckets", "duplicate_components"):
        assert used[prog] == name
        assert cpu[(prog, None if prog != "minhash_signatures" else "mirror")].manifest.report["backend"] == "cpu"
    assert used["exact_duplicates"] == used["fuzzy_duplicates"] == "cpu"  # no twin: the CPU kernels
    assert metadata(twin[("lsh_buckets", None)])["backend"] == name

    def table(store: Store, program: str, name: str, source: str | None = None) -> pa.Table:
        return store.read_table(DataRoot(store).output_dir(spec, program, source), name)

    for source in sources:
        assert table(twin_store, "minhash_signatures", "signatures", source).equals(
            table(cpu_store, "minhash_signatures", "signatures", source))
    for program, name in (("lsh_buckets", "band_keys"), ("lsh_buckets", "edges"), ("duplicate_components", "edges"),
                          ("duplicate_components", "components"), ("fuzzy_duplicates", "removed")):
        assert table(twin_store, program, name).equals(table(cpu_store, program, name)), (program, name)
    removed = table(cpu_store, "fuzzy_duplicates", "removed")
    assert removed.num_rows >= 15, "the planted mirrors must be removed"
    twin_report = twin[("fuzzy_duplicates", None)].manifest.report
    cpu_report = cpu[("fuzzy_duplicates", None)].manifest.report
    assert all(twin_report[k] == cpu_report[k] for k in ("removed", "removed_per_source"))
