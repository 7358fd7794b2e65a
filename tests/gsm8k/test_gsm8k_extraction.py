"""lm-eval's task definitions on the local GSM8K files: data source, prompts, extraction, scoring."""

from __future__ import annotations

import json

import lm_eval  # noqa: F401 - a test dependency (pyproject [test]): missing must fail, not skip
import pytest

from rltbench.commands.gsm8k.tasks import DATA_DIR, apply_filters, build_task, stop_sequences, task_config  # noqa: E402


@pytest.fixture(scope="module")
def cot(tmp_path_factory: pytest.TempPathFactory):
    return build_task("gsm8k_cot", cache_dir=tmp_path_factory.mktemp("ds"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory):
    return build_task("gsm8k", cache_dir=tmp_path_factory.mktemp("ds"))


def _score(task, doc, response: str) -> dict[str, tuple[str, float]]:
    out = {}
    for name, extracted in apply_filters(task, [response], doc).items():
        out[name] = (extracted, float(task.process_results(doc, [extracted])["exact_match"]))
    return out


def test_local_data_and_task_shape(cot, plain) -> None:
    cfg = task_config("gsm8k_cot")
    assert cfg["dataset_path"] == "json" and cfg["dataset_kwargs"]["data_files"]["test"].startswith(
        str(DATA_DIR)
    )
    assert len(cot.test_docs()) == 1319 and len(plain.test_docs()) == 1319
    first = json.loads((DATA_DIR / "test.jsonl").read_text().splitlines()[0])
    assert cot.test_docs()[0]["question"] == first["question"]
    assert cot.doc_to_target(cot.test_docs()[0]) == "18"
    assert "Q:" in stop_sequences(cot) and "Question:" in stop_sequences(plain)
    assert cot.config.num_fewshot == 8 and plain.config.num_fewshot == 5
    assert (DATA_DIR / "LICENSE").is_file()


def test_cot_extraction_known_answers(cot) -> None:
    doc = cot.test_docs()[0]  # target 18
    good = _score(cot, doc, " She has 16 - 3 - 4 = 9 eggs, 9 * 2 = 18. The answer is 18.")
    assert good["strict-match"] == ("18", 1.0) and good["flexible-extract"][1] == 1.0
    no_phrase = _score(cot, doc, " 16 - 3 - 4 = 9 and 9 * 2 = 18")
    assert no_phrase["strict-match"] == ("[invalid]", 0.0)
    assert no_phrase["flexible-extract"] == ("18", 1.0)  # the last number
    wrong = _score(cot, doc, " 9 * 2 = 18 eggs. The answer is 17.")
    assert wrong["strict-match"] == ("17", 0.0) and wrong["flexible-extract"] == ("17.", 0.0)
    big = dict(doc, answer="... #### 1000")
    commas = _score(cot, big, " The answer is 1,000.")
    assert commas["strict-match"] == ("1,000", 1.0)  # ',' is in regexes_to_ignore


def test_plain_gsm8k_extraction(plain) -> None:
    doc = plain.test_docs()[0]
    res = _score(plain, doc, " 16-3-4=9 eggs, 9*2=$18\n#### 18")
    assert res["strict-match"] == ("18", 1.0)
    res = _score(plain, doc, " The answer is 18")
    assert res["strict-match"] == ("[invalid]", 0.0) and res["flexible-extract"] == ("18", 1.0)
