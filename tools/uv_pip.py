"""``uv pip ARGS`` on this interpreter's venv, with pip's configuration, which uv does not read.

The Makefile installs the venv with uv (on 2 cores `.[dev]` took 12-15 s, pip 70 s) and falls back
to pip where this fails. uv reads neither pip.conf nor ``PIP_*``: a wheel that pip finds in a
find-links folder (the CPU build of torch pinned in pyproject.toml, on this project's machines)
would otherwise come from the index (a CUDA build, ~3 GB). So the settings pip itself would install
with are passed on, as pip resolves them (its files in their order, its ``install`` section, the
environment last, each replacing the one before): find-links, index URLs, ``no-index``,
constraints, and the CA bundle as ``SSL_CERT_FILE``. A local find-links folder or extra index that
does not exist is left out, as pip warns and goes on where uv would stop. Across indexes uv takes,
as pip does, the best version any of them has (``unsafe-best-match``; uv's default takes each
package from the first index that has it: here ray from a local extra index that lacks the pinned
2.60.0, and the resolution fails). uv's own configuration files are not read (``--no-config``).
Index URLs go in the environment, not on the command line, where their credentials would show in
``ps``.

Given pip's configuration on this project's machines, the dev install is the same 222 packages at
the same versions as pip's. Any failure here (pip's internals moved, uv cannot reach an index)
exits non-zero, and the Makefile installs with pip.

Usage: ``python tools/uv_pip.py install -e '.[dev]'``: the interpreter that runs this is the
venv's; uv is found beside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname


@dataclass(frozen=True)
class PipSettings:
    """The settings of ``pip install`` that decide where packages come from."""

    index_url: str = "https://pypi.org/simple"
    extra_index_urls: tuple[str, ...] = ()
    no_index: bool = False
    find_links: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    cert: str | None = None


def pip_settings() -> PipSettings:
    """What ``pip install`` would use here: pip's own parse of its files and environment (pip's
    internals, the only complete account of its precedence; if they move, this fails)."""
    from pip._internal.commands import create_command

    options, _ = create_command("install").parse_args([])
    return PipSettings(options.index_url, tuple(options.extra_index_urls), bool(options.no_index),
                       tuple(options.find_links), tuple(options.constraints), options.cert)


def local_or_remote(location: str) -> str | None:
    """``location`` as uv takes it: a remote URL as it is, a local folder or file (a path, ``~``
    expanded, or a ``file://`` URL) where it exists; None for a local one that does not."""
    parsed = urlparse(location)
    if parsed.scheme in ("http", "https"):
        return location
    if parsed.scheme == "file":
        return location if Path(url2pathname(parsed.path)).exists() else None
    path = os.path.expanduser(location)
    return path if Path(path).exists() else None


def uv_invocation(pip: PipSettings) -> tuple[list[str], dict[str, str]]:
    """uv's options and environment for pip's settings."""
    args = ["--no-config", "--index-strategy", "unsafe-best-match"]
    env: dict[str, str] = {}
    if pip.no_index:
        args.append("--no-index")
    else:
        env["UV_DEFAULT_INDEX"] = pip.index_url
        extra = [url for url in map(local_or_remote, pip.extra_index_urls) if url]
        if extra:
            env["UV_EXTRA_INDEX_URL"] = " ".join(extra)
    for folder in filter(None, map(local_or_remote, pip.find_links)):
        args += ["--find-links", folder]
    for constraints in pip.constraints:
        args += ["--constraint", constraints]
    if pip.cert:
        env["SSL_CERT_FILE"] = pip.cert
    return args, env


def main() -> int:
    args, env = uv_invocation(pip_settings())
    uv = Path(sys.executable).with_name("uv")
    cmd = [str(uv), "pip", *sys.argv[1:2], "--python", sys.executable, *args, *sys.argv[2:]]
    return subprocess.run(cmd, env={**os.environ, **env}).returncode


if __name__ == "__main__":
    sys.exit(main())
