"""Write ``tests/data/datatrove_decisions.json``: datatrove's own decisions on the sample corpus.

``tests/e2e/test_heuristics_datatrove.py`` checks the datatrove mode (``rules: datatrove``) against
this file, so CI checks the agreement without datatrove installed. Each document of
``curate sample`` (``scraps`` and ``benchmarks`` left out) is named by the sha256 of its text (the
corpus is built from the installed packages, so another machine shares most documents, not all)
and mapped to datatrove 0.10.1's reason for removing it, as the mode's rule name
(``bench/heuristics.py``'s ``DT_MODE_RULE``; None: kept), for two settings: the
default thresholds, and those plus FineWeb's short-line, char-duplicate and list rules.

    pip install -e '.[bench]' && python bench/datatrove_decisions.py
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from common import sample_texts
from heuristics import DT_MODE_RULE, run_datatrove

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from curation_dagster.tools.sample import build_sample
from stages.params import FilteredDocumentsParams

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "datatrove_decisions.json"
SETTINGS: dict[str, dict[str, float]] = {
    "default": {},
    "fineweb": {"max_short_lines_frac": 0.67, "max_char_dup_frac": 0.01, "max_newline_word_ratio": 0.3},
}


def text_id(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        build_sample(Path(tmp) / "corpus")
        texts = list(dict.fromkeys(sample_texts(Path(tmp) / "corpus")))
    out: dict[str, object] = {"datatrove": version("datatrove"), "settings": {}}
    for name, extra in SETTINGS.items():
        params = FilteredDocumentsParams(rules="datatrove", **extra)
        dt = run_datatrove(texts, params)
        out["settings"][name] = {  # type: ignore[index]
            "params": extra,
            "decisions": {text_id(t): DT_MODE_RULE.get(r, r) if r else None
                          for t, r in zip(texts, dt["reason"], strict=True)},
        }
        print(f"{name}: {len(texts)} documents, {sum(r is not None for r in dt['reason'])} removed")
    OUT.write_text(json.dumps(out, indent=0, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
