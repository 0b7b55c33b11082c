"""What each image must carry, read from the code and the Dockerfiles rather than trusted.

``needed(image)``: the third-party modules the image's processes import, found by walking the
imports (module level and inside functions) of ``stages`` and ``curation_dagster`` from the
image's entry points, plus what is loaded by name rather than imported (fsspec's ``s3://``
implementation, the Dagster instance's storage and run launcher). ``carried(image)``: the
distributions its Dockerfile installs (the project's dependencies and its ``ARG EXTRAS``, via
docker/requirements.py), closed over their own requirements with this environment's metadata.
``missing(image)`` compares the two. tests/curation_dagster/ops/test_k8s.py checks all three images this way;
tests/curation_dagster/ops/test_images.py also imports the modules inside the two images it builds.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import re
import sys
from functools import cache
from pathlib import Path

from packaging.requirements import Requirement

from stages.catalog import PROGRAMS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("stages", "curation_dagster")
IMAGES = ("cpu", "gpu", "dagster")

# Loaded by name, not by an import statement the walk would see.
BY_NAME = {
    # The data root and sources may be s3:// URLs: fsspec finds s3fs by the protocol.
    "cpu": {"s3fs"},
    "gpu": {"s3fs"},
    # The Helm chart's instance (dagster.yaml) names its storage and run launcher by module; the
    # code server and run workers load them: PostgreSQL storage, K8sRunLauncher.
    "dagster": {"s3fs", "dagster_postgres", "dagster_k8s"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


class _Imports(ast.NodeVisitor):
    """The imports of one module: absolute name, whether inside a function (run only when that
    function is called), whether optional (inside ``try: ... except ImportError``). Imports under
    ``if TYPE_CHECKING:`` never run and are skipped."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.found: list[tuple[str, bool, bool]] = []
        self._in_function = 0
        self._guarded = 0

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._in_function += 1
        self.generic_visit(node)
        self._in_function -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            for stmt in node.orelse:
                self.visit(stmt)
            return
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        guarded = any(isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                      for h in node.handlers)
        self._guarded += guarded
        for stmt in node.body:
            self.visit(stmt)
        self._guarded -= guarded
        for handler in node.handlers:
            self.visit(handler)
        for stmt in [*node.orelse, *node.finalbody]:
            self.visit(stmt)

    def _add(self, name: str) -> None:
        self.found.append((name, self._in_function > 0, self._guarded > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:  # relative: against this module's package
            parts = self.package.split(".")
            base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
        self._add(base)
        for alias in node.names:  # `from pkg import module` imports a module
            self._add(f"{base}.{alias.name}")


@cache
def _imports(module: str) -> tuple[tuple[str, bool, bool], ...]:
    """(absolute name, in a function, optional) of every import in ``module``."""
    path = _modules()[module]
    visitor = _Imports(module if path.name == "__init__.py" else module.rpartition(".")[0])
    visitor.visit(ast.parse(path.read_text()))
    return tuple(visitor.found)


def entry_points(image: str) -> list[str]:
    """The modules an image's processes start from."""
    if image == "dagster":  # the code server, the run workers and `curate` (docs/kubernetes.md)
        return [m for m in _modules() if m.split(".")[0] == "curation_dagster"]
    programs = [n for n, p in PROGRAMS.items() if image == "gpu" or p.resources.image == image]
    return ["stages.__main__", "stages.cli", *(f"stages.programs.{n}" for n in programs)]


def needed(image: str) -> set[str]:
    """Top-level third-party modules the image's processes import.

    Optional imports (``except ImportError`` with a message naming the extra to install) count
    for the GPU image only, the one that runs every program. The code location runs no stage
    program (every partition is a pod), so of the ``stages`` modules it imports (catalog, spec,
    plan, execute, store, ...) only their module-level imports count: their functions that load a program's
    libraries (torch in stages.backend, ray in stages.parallel) run in the stage images;
    tests/test_install.py checks that loading the definitions imports none of them."""
    seen: set[str] = set()
    todo = list(entry_points(image))
    out = set(BY_NAME[image])
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # a package's __init__ runs first
        for name, in_function, optional in _imports(module):
            if optional and image != "gpu":
                continue
            if in_function and image == "dagster" and parts[0] == "stages":
                continue
            top = name.split(".")[0]
            if top in PACKAGES:
                todo += [n for n in (name, name.rpartition(".")[0]) if n in _modules()]
            elif top and top not in sys.stdlib_module_names and top != "__future__":
                out.add(top)
    return out


def extras(image: str) -> str:
    text = (ROOT / "docker" / f"Dockerfile.{image}").read_text()
    (found,) = re.findall(r"(?m)^ARG EXTRAS=(\S+)$", text)
    return found


def requirements(image: str, with_extras: str | None = None) -> list[str]:
    """What the Dockerfile installs (with its ``ARG EXTRAS``, or ``with_extras``), as
    docker/requirements.py lists it."""
    spec = importlib.util.spec_from_file_location("docker_requirements", ROOT / "docker" / "requirements.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pyproject = ROOT / "pyproject.toml"
    return [*module.requirements(pyproject), *module.requirements(pyproject, with_extras or extras(image))]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def carried(image: str, with_extras: str | None = None) -> set[str]:
    """Normalised names of the distributions the image installs: its requirements and theirs,
    recursively, as this environment's metadata declares them (markers evaluated for Linux)."""
    out: set[str] = set()
    todo = [Requirement(r) for r in requirements(image, with_extras)]
    env = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in out:
            continue
        out |= {name, key}
        try:
            declared = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue  # not installed here: its own requirements are unknown, its name counts
        for raw in declared:
            sub = Requirement(raw)
            if sub.marker is None or any(sub.marker.evaluate({**env, "extra": e}) for e in req.extras or {""}):
                todo.append(sub)
    return {n for n in out if "[" not in n}


def distributions_of(module: str) -> set[str]:
    """Normalised distribution names that provide a top-level module (its own name, for a
    module this environment lacks: dagster_postgres -> dagster-postgres)."""
    return {_norm(d) for d in md.packages_distributions().get(module, [module])}


def missing(image: str, with_extras: str | None = None) -> dict[str, set[str]]:
    """Modules the image needs but no distribution it installs provides, with their providers."""
    have = carried(image, with_extras)
    return {m: providers for m in sorted(needed(image)) if not (providers := distributions_of(m)) & have}
