"""The questions of a run's splits, parsed and validated before any tokenisation. Free of torch, transformers and
accelerate, so that `python -m qa_train` refuses a bad file before importing them (seconds)."""

from __future__ import annotations

from dataclasses import dataclass, field

from qa_train.config.settings import TrainArgs
from qa_train.data.hub import HubDataset
from qa_train.data.load import AnswerRule, Examples, load_file, load_split


@dataclass
class Splits:
    """Parsed and validated questions, before any tokenisation."""

    train: Examples | None  # None: --do_train false
    evaluation: Examples | None
    test: Examples | None = None
    warnings: list[str] = field(default_factory=list)  # logged once, by the main process, when it featurises


def shared_questions(train: Examples | None, evaluation: Examples | None, shown: int = 3) -> list[str]:
    """Evaluation questions that also train make EM/F1 measure recall, not answering: a warning rather than a
    refusal, as scoring the training data is a fair check that a model can fit it at all."""
    if train is None or evaluation is None:
        return []
    training = set(train.ids)
    shared = [qid for qid in evaluation.ids if qid in training]
    if not shared:
        return []
    why = "EM/F1 will measure recall of the training data, not answering unseen questions"
    if len(shared) == len(evaluation):
        same = "; the files are identical" if train.fingerprint == evaluation.fingerprint else ""
        return [
            f"{evaluation.source}: all {len(evaluation)} evaluation questions are training questions too "
            f"(their ids are in {train.source}{same}); {why}"
        ]
    return [
        f"{evaluation.source}: {len(shared)} of {len(evaluation)} evaluation questions share an id with a "
        f"training question in {train.source} (e.g. {', '.join(map(repr, shared[:shown]))}); {why}"
    ]


def unanswered_note(examples: Examples | None, v2: bool) -> str | None:
    """A labelled file of questions to answer where some have no answer is SQuAD v2.0 data: without
    --version_2_with_negative each of them still gets a span, which the user may not expect."""
    if examples is None or v2:
        return None
    unanswered = sum(not texts for texts in examples.answer_texts)
    if not 0 < unanswered < len(examples):
        return None
    return (
        f"{examples.source}: {unanswered} of {len(examples)} questions have no answer (SQuAD v2.0 data?); "
        'without --version_2_with_negative every question gets a span, never ""'
    )


def load_splits(args: TrainArgs) -> Splits:
    """Every rank parses and validates on its own, before any process group exists: a bad record is
    refused by each rank in one line, and no rank is left waiting in a collective for one that failed."""
    d, m = args.data, args.model
    rule: AnswerRule = "may_be_empty" if d.version_2_with_negative else "required"
    hub = HubDataset(d.dataset_name, d.dataset_config_name, m.cache_dir, m.token) if d.dataset_name else None
    # --do_train false reads no training file at all, not even to count it.
    train = load_split(d.train_file, hub, "train", d.max_train_samples, rule) if args.eval.do_train else None
    evaluation = (
        load_split(d.validation_file, hub, "validation", d.max_eval_samples, rule)
        if args.eval.needs_eval_data
        else None
    )
    test = (
        load_file(d.test_file, "optional").head(d.max_predict_samples)
        if args.eval.do_predict and d.test_file is not None  # validated: --do_predict comes with --test_file
        else None
    )
    note = unanswered_note(test, d.version_2_with_negative)  # --do_predict's file, as `qa-train predict` notes it
    return Splits(train, evaluation, test, shared_questions(train, evaluation) + ([note] if note else []))
