"""``uv pip ARGS`` on this interpreter's venv, with pip's configuration, which uv does not read.

The Makefile installs the venv with uv (a 2-core machine: `.[dev]` in 12 s, pip took 70 s) and
falls back to pip where uv fails. uv reads neither pip.conf nor ``PIP_*``: a wheel that pip finds
in a find-links folder (the CPU build of torch pinned in pyproject.toml, on this project's
machines) would otherwise come from the index (a CUDA build, ~3 GB). So pip's own view of its
configuration (``pip config list``: files and environment) is passed on: find-links, index URLs,
constraints, and its CA bundle as ``SSL_CERT_FILE``. An index or folder that does not exist is
left out, as pip warns and goes on where uv would stop. Across indexes uv takes, as pip does, the
best version any of them has (``unsafe-best-match``; uv's default takes each package from the first
index that has it: an older botocore from a local extra index, say). Given pip's configuration on
this project's machines, the dev install is the same 222 packages at the same versions as pip's.

Usage: ``python tools/uv_pip.py install -e '.[dev]'``: the interpreter that runs this is the
venv's; uv is found beside it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

# pip's option -> uv's; the values of each are whitespace-separated lists
OPTIONS = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url",
           "constraint": "--constraint"}


def pip_config() -> dict[str, list[str]]:
    """pip's configuration, every scope: option -> values (the environment's last, as pip ranks it)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    config: dict[str, list[str]] = {}
    for line in out.splitlines():  # global.find-links='/opt/wheels'
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            values = str(ast.literal_eval(value)).split()
        except (ValueError, SyntaxError):
            continue
        config.setdefault(key.rsplit(".", 1)[-1], []).extend(values)
    return config


def reachable(location: str) -> bool:
    """A local folder or file that exists (plain or ``file://``), or any remote URL."""
    parsed = urlparse(location)
    if parsed.scheme in ("http", "https"):
        return True
    return Path(parsed.path if parsed.scheme == "file" else location).exists()


def uv_arguments(config: dict[str, list[str]]) -> list[str]:
    """uv's options for pip's ``config``, each value once."""
    args: list[str] = []
    for option, flag in OPTIONS.items():
        values = [v for v in dict.fromkeys(config.get(option, [])) if reachable(v)]
        if option == "index-url":
            values = values[-1:]  # one index: the environment's, where it sets one
        for value in values:
            args += [flag, value]
    return args


def main() -> int:
    config = pip_config()
    env = dict(os.environ)
    certs = [c for c in config.get("cert", []) if Path(c).is_file()]
    if certs and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = certs[-1]
    uv = Path(sys.executable).with_name("uv")
    cmd = [str(uv), "pip", *sys.argv[1:2], "--python", sys.executable, "--index-strategy", "unsafe-best-match",
           *uv_arguments(config), *sys.argv[2:]]
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
