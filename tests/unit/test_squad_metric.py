"""The `evaluate` SQuAD metric gives exactly qa_train.squad.scoring's numbers, offline."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from conftest import DEMO_DEV

from qa_train.squad.files import load_references
from qa_train.squad.scoring import score

# Hub "squad" rows. Hand-computed per question (EM, F1):
#   several: "the denver broncos" normalises to "denver broncos", gold 1 -> (1, 1)
#   articles: "Apple, day." and "an apple a day" both normalise to "apple day" -> (1, 1)
#   partial: [1843, by] vs [1843]: P 1/2, R 1 -> 2/3; vs [in, 1843]: P = R = 1/2 -> 1/2; best (0, 2/3)
#   wrong: "London" vs "Paris" -> (0, 0)
REFERENCES = [
    {"id": "several", "answers": {"text": ["Denver Broncos", "the Broncos", "Broncos"], "answer_start": [0, 4, 11]}},
    {"id": "articles", "answers": {"text": ["an apple a day"], "answer_start": [7]}},
    {"id": "partial", "answers": {"text": ["1843", "in 1843"], "answer_start": [12, 9]}},
    {"id": "wrong", "answers": {"text": ["Paris"], "answer_start": [0]}},
]
PREDICTIONS = [
    {"id": "several", "prediction_text": "The Denver Broncos!"},
    {"id": "articles", "prediction_text": "Apple, day."},
    {"id": "partial", "prediction_text": "1843 by"},
    {"id": "wrong", "prediction_text": "London"},
]
HAND = {"exact_match": 100 * 2 / 4, "f1": 100 * (1 + 1 + 2 / 3 + 0) / 4}


def squad_eval_numbers(predictions: list[dict], references: list[dict]) -> dict[str, float]:
    result = score(
        {r["id"]: r["answers"]["text"] for r in references}, {p["id"]: p["prediction_text"] for p in predictions}
    )
    return {"exact_match": result["exact_match"], "f1": result["f1"]}


def _no_network(*args: object, **kwargs: object) -> None:
    raise OSError("test_squad_metric: the metric tried to open a network connection")


def _drop_loaded_metric_modules() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "evaluate_modules"]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def squad_metric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """qa_train.squad.metric with every Hugging Face cache under tmp and no network."""
    home = tmp_path_factory.mktemp("hf_home")
    caches = {
        "HF_MODULES_CACHE": home / "modules",
        "HF_METRICS_CACHE": home / "metrics",
        "HF_EVALUATE_CACHE": home / "evaluate",
    }
    with pytest.MonkeyPatch.context() as mp:
        # evaluate reads these once, at import, so they must be set before the first import...
        mp.setenv("HF_HOME", str(home))
        for name, path in caches.items():
            mp.setenv(name, str(path))
        for name in ("HF_HUB_OFFLINE", "HF_EVALUATE_OFFLINE", "HF_DATASETS_OFFLINE"):
            mp.setenv(name, "1")
        import evaluate.config

        # ...and if another test imported evaluate earlier, its copies are redirected here too.
        for name, path in caches.items():
            mp.setattr(evaluate.config, name, path)
        mp.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
        mp.setattr(socket.socket, "connect", _no_network)
        mp.setattr(sys, "path", list(sys.path))  # evaluate.load appends its modules cache
        _drop_loaded_metric_modules()  # a package imported from another cache would shadow ours
        from qa_train.squad import metric as squad_metric

        yield squad_metric
        _drop_loaded_metric_modules()


def test_class_gives_squad_eval_numbers(squad_metric: ModuleType) -> None:
    got = squad_metric.Squad().compute(predictions=PREDICTIONS, references=REFERENCES)
    assert got == squad_eval_numbers(PREDICTIONS, REFERENCES)
    assert got == pytest.approx(HAND)


def test_evaluate_load_of_the_script_gives_the_same_numbers(squad_metric: ModuleType) -> None:
    import evaluate

    metric = evaluate.load(squad_metric.SCRIPT)
    assert metric.name == "squad"  # the hub metric's name, so combine() keys read the same
    assert metric.compute(predictions=PREDICTIONS, references=REFERENCES) == squad_eval_numbers(PREDICTIONS, REFERENCES)


def test_add_batch_combine_and_row_order(squad_metric: ModuleType) -> None:
    import evaluate

    expected = squad_eval_numbers(PREDICTIONS, REFERENCES)
    metric = squad_metric.Squad()
    metric.add_batch(predictions=PREDICTIONS[:2], references=REFERENCES[:2])
    metric.add_batch(predictions=PREDICTIONS[2:], references=REFERENCES[2:])
    assert metric.compute() == expected
    # Scored by id, as the hub metric does, not by row position.
    shuffled = squad_metric.Squad().compute(predictions=PREDICTIONS[::-1], references=REFERENCES)
    assert shuffled == expected
    assert evaluate.combine([squad_metric.Squad()]).compute(predictions=PREDICTIONS, references=REFERENCES) == expected


def test_demo_dev_set_matches_the_squad_eval_loader(squad_metric: ModuleType) -> None:
    """The bundled dev set in hub rows scores exactly as the squad_eval CLI reads it."""
    references = []
    for article in json.loads(DEMO_DEV.read_text(encoding="utf-8"))["data"]:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                answers = {
                    "text": [a["text"] for a in qa["answers"]],
                    "answer_start": [a["answer_start"] for a in qa["answers"]],
                }
                references.append({"id": qa["id"], "answers": answers})
    # Every third prediction exact, the rest the first answer's last word only: EM and F1 both
    # land strictly between 0 and 100, so a wrong normalisation or averaging would show.
    predictions = [
        {
            "id": r["id"],
            "prediction_text": r["answers"]["text"][0] if i % 3 == 0 else r["answers"]["text"][0].split()[-1],
        }
        for i, r in enumerate(references)
    ]
    got = squad_metric.Squad().compute(predictions=predictions, references=references)
    result = score(load_references(DEMO_DEV), {p["id"]: p["prediction_text"] for p in predictions})
    assert got == {"exact_match": result["exact_match"], "f1": result["f1"]}
    assert 0 < got["exact_match"] < got["f1"] < 100


def test_duplicate_ids_are_refused_and_unmatched_ids_warned(squad_metric: ModuleType) -> None:
    # In memory: a compute that raises keeps its cache-file lock, and the next metric would
    # wait a second for it before picking another file.
    with pytest.raises(ValueError, match="references: question wrong: id appears more than once"):
        squad_metric.Squad(keep_in_memory=True).compute(
            predictions=PREDICTIONS + PREDICTIONS[-1:], references=REFERENCES + REFERENCES[-1:]
        )
    renamed = PREDICTIONS[:-1] + [{"id": "typo", "prediction_text": "Paris"}]
    with pytest.warns(UserWarning, match="1 of 4 reference ids have no prediction and score 0: wrong"):
        got = squad_metric.Squad().compute(predictions=renamed, references=REFERENCES)
    assert got == squad_eval_numbers(renamed, REFERENCES) == pytest.approx(HAND)


V2_REFERENCES = [
    *REFERENCES,
    {"id": "none1", "answers": {"text": [], "answer_start": []}},
    {"id": "none2", "answers": {"text": [], "answer_start": []}},
]
V2_PREDICTIONS = [{**p, "no_answer_probability": prob} for p, prob in zip(PREDICTIONS, (0.1, 0.2, 0.9, 0.3))] + [
    {"id": "none1", "prediction_text": "", "no_answer_probability": 0.8},
    {"id": "none2", "prediction_text": "Rome", "no_answer_probability": 0.6},
]


def test_v2_metric_gives_the_official_v2_numbers_offline(squad_metric: ModuleType) -> None:
    """The hub's "squad_v2" inputs and outputs (transformers' examples with --version_2_with_negative),
    scored by squad_eval.score_v2; a threshold turns confident no-answers into ""."""
    import evaluate

    from qa_train.squad import metric_v2 as squad_v2_metric
    from qa_train.squad.scoring import score_v2

    metric = evaluate.load(squad_v2_metric.SCRIPT)
    assert metric.name == "squad_v2"
    for threshold in (1.0, 0.5):
        got = metric.compute(predictions=V2_PREDICTIONS, references=V2_REFERENCES, no_answer_threshold=threshold)
        expected = score_v2(
            {r["id"]: r["answers"]["text"] for r in V2_REFERENCES},
            {p["id"]: p["prediction_text"] for p in V2_PREDICTIONS},
            {p["id"]: p["no_answer_probability"] for p in V2_PREDICTIONS},
            threshold,
        )
        assert got == pytest.approx(expected)
        assert (got["total"], got["HasAns_total"], got["NoAns_total"]) == (6, 4, 2)
    # At 1.0 nothing is thresholded: none1 ("" for no answer) is right, none2 ("Rome") wrong.
    assert metric.compute(predictions=V2_PREDICTIONS, references=V2_REFERENCES)["NoAns_exact"] == 50.0
    # At 0.5 "partial" (0.9) and both no-answers (0.8, 0.6) become "": NoAns all right, "partial" lost.
    at_half = metric.compute(predictions=V2_PREDICTIONS, references=V2_REFERENCES, no_answer_threshold=0.5)
    assert at_half["NoAns_exact"] == 100.0 and at_half["HasAns_f1"] == pytest.approx(100 * (1 + 1 + 0 + 0) / 4)
