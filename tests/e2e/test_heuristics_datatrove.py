"""The datatrove mode on the sample corpus (``curate sample``): the same decisions as datatrove."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from stages.kernels import datatrove_rules
from stages.kernels import heuristics as H
from stages.kernels import heuristics_datatrove as D
from stages.params import FilteredDocumentsParams

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "datatrove_decisions.json"

def _golden_agreement(setting: str, tmp_path: Path) -> tuple[int, float, float]:
    from curation_dagster.tools.sample import build_sample

    data = json.loads(GOLDEN.read_text())
    assert data["datatrove"] == datatrove_rules.DATATROVE_VERSION  # regenerate both together
    golden = data["settings"][setting]
    build_sample(tmp_path / "corpus")
    texts: dict[str, str] = {}
    for source in sorted(p for p in (tmp_path / "corpus").iterdir() if p.is_dir()):
        if source.name in ("scraps", "benchmarks"):
            continue
        for part in sorted(source.iterdir()):
            data = gzip.decompress(part.read_bytes()) if part.suffix == ".gz" else part.read_bytes()
            for line in data.decode().splitlines():
                if line.strip():
                    text = json.loads(line)["text"]
                    key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
                    if key in golden["decisions"]:
                        texts[key] = text
    keys = sorted(texts)
    params = FilteredDocumentsParams(rules="datatrove", **golden["params"])
    keep, reason, _ = H.decide(D.score_documents([texts[k] for k in keys]), params, rules=D.RULE_TABLE)
    theirs = [golden["decisions"][k] for k in keys]  # our rule name for datatrove's reason, None: kept
    agree = float(np.mean([k == (t is None) for k, t in zip(keep.tolist(), theirs, strict=True)]))
    same = float(np.mean([r == t for r, t in zip(reason.tolist(), theirs, strict=True)]))
    return len(keys), agree, same

@pytest.mark.slow
@pytest.mark.parametrize("setting", ["default", "fineweb"])
def test_agrees_with_datatrove_on_the_sample_corpus(setting: str, tmp_path: Path) -> None:
    n, agree, same_rule = _golden_agreement(setting, tmp_path)
    assert n >= 1000, f"only {n} documents of the golden file are in this machine's sample corpus"
    # The bar is 0.99 (issue 18); the port measures 1.0, so allow at most 1 in 1,000 (a Unicode table change)
    assert agree >= 0.999 and same_rule >= 0.999, (n, agree, same_rule)
