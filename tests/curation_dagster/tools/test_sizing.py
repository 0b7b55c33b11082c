"""``curate size``: the sizing command over stages.sizing (config, --model, errors, its output)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from curation_dagster.tools.sizing import parse_model, sizing
from stages.sizing import (
    MINILM,
    Assumptions,
    Model,
    setting_from_config,
)
from tests.support.tiny_corpus import curate


def test_setting_from_config() -> None:
    default = setting_from_config({})
    assert (default.bands, default.rows, default.num_perm, default.verify) == (26, 10, 260, True)
    assert default.models == (MINILM,)
    cfg = {"stages": ["heuristic", "exact", "fuzzy"],
           "params": {"lsh_buckets": {"preset": "seed"}, "minhash_signatures": {"num_perm": 128},
                      "duplicate_components": {"verify": "none"}}}
    s = setting_from_config(cfg, (parse_model("clf=140M:512"),))
    assert (s.bands, s.rows, s.num_perm, s.verify) == (20, 13, 128, False)
    assert s.models == (Model("clf", 140_000_000, 512),)  # no semantic stage: no embedding model
    with pytest.raises(ValueError, match="no known parameter count"):
        setting_from_config({"params": {"document_embeddings": {"model": "/models/other"}}})
    assert setting_from_config({"params": {"document_embeddings": {"model": "other"}}},
                               (parse_model("other=1e8"),)).models == (Model("other", 100_000_000, 512),)

def test_parse_model_errors() -> None:
    with pytest.raises(ValueError, match="NAME=PARAMS"):
        parse_model("justaname")
    with pytest.raises(ValueError, match=">= 0"):
        sizing(-1, 10, {}, Assumptions())

def test_cli_size(tmp_path: Path) -> None:
    config = tmp_path / "curate.json"
    config.write_text(json.dumps({"params": {"lsh_buckets": {"preset": "seed"}}}))
    code, out, err = curate("size", "--docs", "1000000", "--mean-chars", "2000", "--config", str(config),
                            "--dup-rate", "0.1", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["signatures"]["bytes"] == 1_076_000_000
    assert got["candidates"]["candidate_pairs"] == pytest.approx(99_716.46685, rel=1e-9)
    assert got["assumptions"]["dup_rate"] == 0.1 and got["assumptions"]["tokens_per_char"] == 0.25
    assert got["memory_gib"]["lsh_buckets"]["requested"] == 8.0
    code, out, err = curate("size", "--docs", "1000000", "--mean-chars", "2000")
    assert code == 0, err
    for words in ("signature table", "band keys", "candidate pairs", "verification spill", "GPU-hours",
                  "memory per stage pod", "assumptions"):
        assert words in out
