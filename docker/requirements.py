"""Print pip requirements from pyproject.toml, one per line: the project's own dependencies, or,
given a comma-separated list of extras, the requirements of those extras.

The images install their dependencies from these lists before copying the code, so that neither
a code change nor another edit of pyproject.toml reinstalls them (docker/Dockerfile.*);
docker/build-images.sh collects the same lists into a wheelhouse; tests/support/image_contents.py reads
what an image carries through it. Standard library only:
it runs in an image before anything is installed.

    python requirements.py                  # [project] dependencies
    python requirements.py s3,ray,quality   # those of the extras s3, ray and quality
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: str = "") -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    if not extras:
        return list(project["dependencies"])
    table = project["optional-dependencies"]
    out: list[str] = []
    todo, seen = [e.strip() for e in extras.split(",")], set()
    while todo:
        extra = todo.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        if extra not in table:
            raise SystemExit(f"unknown extra {extra!r}; pyproject.toml has {sorted(table)}")
        for req in table[extra]:
            # An extra that names the project itself ("curation-dagster[a,b]") stands for those
            # extras: pip would look for the project on the index instead.
            name, _, rest = req.partition("[")
            if name.strip().lower().replace("_", "-") == project["name"]:
                todo += [e.strip() for e in rest.split("]", 1)[0].split(",")]
            elif req not in out:
                out.append(req)
    return out


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    pyproject = next(p for p in (here / "pyproject.toml", here.parent / "pyproject.toml") if p.exists())
    print("\n".join(requirements(pyproject, sys.argv[1] if len(sys.argv) > 1 else "")))
