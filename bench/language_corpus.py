"""The language-identification evaluation corpus, built from real text installed on this machine.

Pages (one JSON object per line: ``id``, ``group``, ``origin``, ``lang``, ``split``, ``text``):

- ``man``: manual pages rendered to plain text by ``man -l`` (no hyphenation, no justification),
  English from ``/usr/share/man/man[1-8]`` and translated ones from ``/usr/share/man/<lang>/``.
  Technical pages: option lists, synopses, command lines, file paths, examples.
- ``gettext``: message catalogs (``/usr/share/locale/<lang>/LC_MESSAGES/*.mo`` and the ``.mo``
  files of installed Python packages): the translated strings (``msgstr``) of one catalog cut into
  pages of about ``PAGE_CHARS`` characters, and the English source strings (``msgid``) of the same
  catalogs as English pages. UI text full of ``%s``, ``--options``, ``{placeholders}`` and
  one-word labels.
- ``pydoc``: ``pydoc`` plain-text help of standard-library modules: English prose around
  signatures, code examples and doctests.
- ``changelog``: the head of Debian changelogs (``/usr/share/doc/*/changelog.Debian.gz``): terse
  English full of package names, versions and bug numbers.

A page's ``lang`` is the ISO 639-1 code of its folder (``pt_BR`` -> ``pt``, ``zh_CN`` -> ``zh``).
``split`` (``dev`` or ``test``) is a hash of the ``group`` (a man page's or catalog's name, a
module), so every translation of one document lands on the same side: tune on ``dev``, report
``test``. What is installed differs between machines; the corpus says what it found.
"""

from __future__ import annotations

import gettext
import glob
import gzip
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

PAGE_CHARS = 2500  # gettext: characters of messages per page
MAX_CHARS = 12_000  # a page longer than this is cut at a line boundary
PER_LANG = 120  # at most this many pages per (origin, language)
ENGLISH_MAN = 500  # English man pages sampled
MIN_CHARS = 200


def lang_code(folder: str) -> str:
    """``pt_BR`` -> ``pt``, ``sr@latin`` -> ``sr``, ``zh_TW`` -> ``zh``."""
    return re.split(r"[_@.]", folder)[0].lower()


def split_of(group: str) -> str:
    return "dev" if hashlib.sha256(group.encode()).digest()[0] % 2 == 0 else "test"


def _cut(text: str, limit: int = MAX_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = text[:limit]
    return head[: head.rfind("\n")] if "\n" in head else head


def render_man(path: str) -> str:
    env = {**os.environ, "MANWIDTH": "100", "MAN_KEEP_FORMATTING": "0", "LC_ALL": "C.UTF-8"}
    try:
        out = subprocess.run(["man", "--nh", "--nj", "-l", path], capture_output=True, env=env, timeout=30,
                             check=False).stdout
    except subprocess.TimeoutExpired:
        return ""
    text = out.decode("utf-8", "replace")
    return re.sub(r".\x08", "", text)  # overstrike (bold/underline) left by some pages


def _lines(text: str) -> list[str]:
    return [ln for ln in (" ".join(x.split()) for x in text.splitlines()) if len(ln) >= 20]


def english_fraction(translated: str, original: str) -> float:
    """Characters of ``translated``'s lines (of 20+ characters, whitespace collapsed) that appear
    as lines of the English ``original``: a "translated" page whose paragraphs were left in
    English (Debian ships several) is mostly English, whatever its folder says."""
    lines = _lines(translated)
    english = set(_lines(original))
    total = sum(map(len, lines))
    return sum(len(ln) for ln in lines if ln in english) / total if total else 0.0


def english_original(path: str) -> str | None:
    """The English page of a translated one: the same file name in ``/usr/share/man/manN``."""
    p = Path(path)
    candidate = Path("/usr/share/man") / p.parent.name / p.name
    return str(candidate) if candidate.exists() else None


def man_pages(rng: random.Random) -> Iterator[tuple[str, str, str]]:
    """(lang, group, path) of the man pages to render."""
    root = Path("/usr/share/man")
    if not root.is_dir():
        return
    english = sorted(glob.glob(str(root / "man[1-8]" / "*")))
    rng.shuffle(english)
    # One installed tool can bring thousands of near-identical generated pages (the cloud SDKs'
    # one page per subcommand): at most a tenth of the English sample comes from one prefix.
    per_prefix: dict[str, int] = defaultdict(int)
    taken = 0
    for path in english:
        prefix = re.split(r"[-_.]", Path(path).name)[0]
        if taken >= ENGLISH_MAN or per_prefix[prefix] >= ENGLISH_MAN // 10:
            continue
        per_prefix[prefix] += 1
        taken += 1
        yield "en", Path(path).name.split(".")[0], path
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("man")):
        pages = sorted(glob.glob(str(folder / "man*" / "*")))
        rng.shuffle(pages)
        for path in pages[:PER_LANG]:
            yield lang_code(folder.name), Path(path).name.split(".")[0], path


def _catalog(path: str) -> dict[str, str]:
    try:
        with open(path, "rb") as fh:
            cat = gettext.GNUTranslations(fh)._catalog  # type: ignore[attr-defined]
    except Exception:
        return {}
    out: dict[str, str] = {}
    for key, value in cat.items():
        msgid = key[0] if isinstance(key, tuple) else key
        if not msgid or not isinstance(value, str) or not value.strip():
            continue
        out[msgid] = value
    return out


def _pages(messages: list[str]) -> Iterator[str]:
    page: list[str] = []
    size = 0
    for m in messages:
        page.append(m.strip("\n"))
        size += len(m)
        if size >= PAGE_CHARS:
            yield "\n".join(page)
            page, size = [], 0
    if size >= MIN_CHARS:
        yield "\n".join(page)


def gettext_pages(rng: random.Random) -> Iterator[dict[str, Any]]:
    paths = glob.glob("/usr/share/locale/*/LC_MESSAGES/*.mo")
    for site in sys.path:
        paths += glob.glob(os.path.join(site, "**", "locale", "*", "LC_MESSAGES", "*.mo"), recursive=True)
    by_lang: dict[str, list[str]] = defaultdict(list)
    for p in sorted(set(paths)):
        by_lang[lang_code(Path(p).parents[1].name)].append(p)
    english: dict[str, list[str]] = {}  # domain -> its msgids (the same in every language)
    count: dict[str, int] = defaultdict(int)
    for lang, files in sorted(by_lang.items()):
        if lang in ("en", "c"):  # English variants (en_GB) are English: not "other-language" pages
            continue
        rng.shuffle(files)
        for path in files:
            if count[lang] >= PER_LANG:
                break
            cat = _catalog(path)
            # Identity "translations" (untranslated strings copied over) are not the language's text.
            msgs = [v for k, v in cat.items() if v.strip() != k.strip()]
            domain = Path(path).stem
            english.setdefault(domain, list(cat))
            for i, page in enumerate(_pages(msgs)):
                if count[lang] >= PER_LANG or i >= 3:  # at most 3 pages of one catalog
                    break
                count[lang] += 1
                yield {"origin": "gettext", "lang": lang, "group": f"mo:{domain}", "text": page}
    domains = sorted(english)
    rng.shuffle(domains)
    n = 0
    for domain in domains:
        for i, page in enumerate(_pages(english[domain])):
            if i >= 2 or n >= 3 * PER_LANG:
                break
            n += 1
            yield {"origin": "gettext", "lang": "en", "group": f"mo:{domain}", "text": page}


def pydoc_pages(rng: random.Random) -> Iterator[dict[str, Any]]:
    import pkgutil
    import pydoc

    names = sorted(m.name for m in pkgutil.iter_modules() if not m.name.startswith("_"))
    stdlib = set(sys.stdlib_module_names)
    names = [n for n in names if n in stdlib and n not in ("antigravity", "this", "idlelib", "tkinter", "turtle")]
    rng.shuffle(names)
    n = 0
    for name in names:
        if n >= 2 * PER_LANG:
            break
        try:
            with open(os.devnull, "w") as null:
                old, sys.stdout = sys.stdout, null
                try:
                    text = pydoc.render_doc(name, renderer=pydoc.plaintext)  # type: ignore[attr-defined]
                finally:
                    sys.stdout = old
        except Exception:
            continue
        if len(text) >= MIN_CHARS:
            n += 1
            yield {"origin": "pydoc", "lang": "en", "group": f"py:{name}", "text": _cut(text)}


def changelog_pages(rng: random.Random) -> Iterator[dict[str, Any]]:
    paths = sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz"))
    rng.shuffle(paths)
    for path in paths[: PER_LANG]:
        try:
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as fh:
                text = fh.read(4000)
        except OSError:
            continue
        if len(text) >= MIN_CHARS:
            yield {"origin": "changelog", "lang": "en", "group": f"pkg:{Path(path).parent.name}", "text": _cut(text)}


def build(out: Path, seed: int = 0, workers: int = 2) -> Path:
    """Write ``out`` (JSONL) unless it exists; returns it."""
    if out.exists():
        return out
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    man = list(man_pages(rng))
    def render(m: tuple[str, str, str]) -> tuple[str, float | None]:
        text = render_man(m[2])
        original = english_original(m[2]) if m[0] != "en" else None
        return text, (english_fraction(text, render_man(original)) if original else None)

    with ThreadPoolExecutor(workers) as pool:
        for (lang, group, _), (text, frac) in zip(man, pool.map(render, man), strict=True):
            text = _cut(text.strip())
            if len(text) >= MIN_CHARS:
                row: dict[str, Any] = {"origin": "man", "lang": lang, "group": f"man:{group}", "text": text}
                if frac is not None:
                    row["english_frac"] = round(frac, 3)
                rows.append(row)
    rows += gettext_pages(rng)
    rows += pydoc_pages(rng)
    rows += changelog_pages(rng)
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    for i, row in enumerate(rows):
        row = {"id": f"p{i:05d}", **row, "split": split_of(row["group"])}
        buf.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(buf.getvalue(), encoding="utf-8")
    tmp.replace(out)
    return out


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


if __name__ == "__main__":
    target = build(Path(sys.argv[1]))
    pages = load(target)
    tally: dict[tuple[str, str], int] = defaultdict(int)
    for p in pages:
        tally[(p["origin"], p["lang"])] += 1
    print(len(pages), "pages")
    for (origin, lang), n in sorted(tally.items()):
        print(f"{origin:10s} {lang:4s} {n}")
