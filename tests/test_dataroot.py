"""The data root is the only shared state: crawl specs and the crawl registry live under it, and
cross-crawl dedup finds earlier crawls in the data root in use."""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path

from curation_dagster import cli

WORDS = ("river stone garden window letter market winter summer engine bridge pocket silver "
         "candle forest ladder mirror basket thunder harbor meadow violin orchard lantern pillow "
         "compass quarry saddle tunnel velvet walnut anchor blanket cactus dolphin falcon glacier").split()


def curate(*args: str) -> tuple[int, str, str]:
    """``curate ARGS`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def documents(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` documents of 80 random words each: no two are near-duplicates of each other."""
    rng = random.Random(seed)
    return [{"id": f"d{i}", "text": " ".join(rng.choice(WORDS) for _ in range(80)) + "."} for i in range(n)]


def write_source(folder: Path, docs: list[dict[str, str]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return folder


def report(*where: str, crawl: str) -> dict[str, dict[str, int]]:
    code, out, err = curate("report", *where, "--crawl", crawl, "--json")
    assert code == 0, err
    return json.loads(out)["sources"]  # type: ignore[no-any-return]


def test_second_crawl_on_a_non_default_data_root_is_deduplicated_against_the_first(tmp_path: Path) -> None:
    """Issue 16: 200 identical documents in crawl 2 are all removed as duplicates of crawl 1's,
    on a data root given with --data-root exactly as on the default one."""
    src = write_source(tmp_path / "in" / "web", documents(200))
    work, root = tmp_path / "w", tmp_path / "elsewhere"
    for crawl in ("c1", "c2"):
        code, _, err = curate("run", "--workdir", str(work), "--data-root", str(root), "--crawl", crawl,
                              "--source", f"web={src}", "--stages", "fuzzy", "--quiet")
        assert code == 0, err
    assert report("--workdir", str(work), crawl="c1")["web"]["kept"] == 200
    second = report("--workdir", str(work), crawl="c2")["web"]
    assert (second["input"], second["kept"], second["removed"]["fuzzy"]) == (200, 0, 200)
