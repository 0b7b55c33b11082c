"""``curation_dagster.tools`` runs where Dagster is not loaded: importing every module under it
loads no ``dagster`` module (the static check of its imports: tests/test_imports.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_importing_every_tool_loads_no_dagster() -> None:
    script = ("import importlib, json, pkgutil, sys; import curation_dagster.tools as t; "
              "names = [m.name for m in pkgutil.iter_modules(t.__path__)]; "
              "[importlib.import_module('curation_dagster.tools.' + n) for n in names]; "
              "print(json.dumps([names, sorted(m for m in sys.modules if m.split('.')[0] == 'dagster')]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr
    names, loaded = json.loads(done.stdout)
    assert {"explain", "lineage", "profile", "report", "sample", "semantic_audit", "sizing"} <= set(names)
    assert loaded == []
