"""One run end to end: build -> fit -> export -> evaluate -> record, in the order the data flows; the weights are
saved before the work after training that can fail."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from qa_train import outcome
from qa_train.config.settings import TrainArgs
from qa_train.core import collector
from qa_train.core.errors import one_line
from qa_train.data.splits import Splits
from qa_train.observe import startup
from qa_train.observe.metrics import TrainSummary
from qa_train.observe.recorder import summary_table
from qa_train.observe.schema import RunMetrics
from qa_train.trainer import Trainer

log = logging.getLogger("qa_train")


class Preempted(Exception):
    """A stop request ended training early; its checkpoint is written and the run resumes from it."""


def run(args: TrainArgs, splits: Splits | None = None) -> RunMetrics | None:
    """Train, export, evaluate and record (with --do_train false: evaluate and record; `splits`: the data, when
    already read). Returns metrics on the main process (None elsewhere)."""
    started, began = time.perf_counter(), startup.now()
    trainer = Trainer(args, splits)
    rank_startup = startup.measure(began, startup.now())
    collector.settle()  # what the build made lives to the end
    initial = trainer.evaluate() if args.eval.eval_on_start else None
    trainer.log_eval(initial)
    if initial is not None:
        start = trainer.state.completed_steps
        label = f"at step {start} (resumed)" if start else "before training"
        log.info("%s: exact_match %.2f, f1 %.2f", label, initial.exact_match, initial.f1)

    trained = trainer.fit() if args.eval.do_train else None
    if trained is not None and not trained.finished:
        if trainer.is_main:  # every rank stops, and a non-main rank still shows warnings: one line is enough
            log.warning(
                "stop requested: checkpoint saved at step %d; rerun with --resume_from_checkpoint latest",
                trained.steps,
            )
        trainer.finish()
        raise Preempted

    # An evaluation-only run exports nothing: its model is --model_name_or_path.
    exported, failed = _export(trainer) if trained is not None else (None, None)
    try:
        scores = trainer.evaluate(Path(args.output.output_dir) / "eval_predictions.json") if args.eval.do_eval else None
        trainer.log_eval(scores)
        trainer.log_samples(scores)
        metrics = outcome.run_metrics(trainer, trained, scores, initial, started=started, startup=rank_startup)
        if metrics is not None and metrics.squad_v2:
            log.info("SQuAD v2.0: %s", ", ".join(f"{k} {v:.4g}" for k, v in metrics.squad_v2.items()))
        _record(trainer, trained, metrics)
        if args.eval.do_predict:
            outcome.predict(trainer, scores)  # with the model the export will be: with --save_best, maybe not the last
    except BaseException as err:  # out of memory, a full disk: the line that says so says where the weights are
        if exported is not None:
            err.add_note(f"the trained model is exported to {exported}")
        raise
    if trained is not None:
        trainer.log_model(outcome.keep_best(trainer, scores, exported))
    trainer.finish()
    if failed is not None:
        raise failed  # the evaluation and metrics.json are written: exit 4
    if metrics is not None:
        print(summary_table(metrics), flush=True)
    return metrics


def _record(trainer: Trainer, trained: TrainSummary | None, metrics: RunMetrics | None) -> None:
    """metrics.json, unless this run trained no step and the run that trained the model wrote one: resumed at the
    last step (a requeued finished job, a rerun after a failed export), it cannot measure loss, speed or time."""
    earlier = trainer.output_dir / "metrics.json"
    if trained is not None and trained.steps == trainer.first_step > 0 and earlier.is_file():
        if trainer.is_main:
            log.warning(
                "resumed at step %d, the last: no step was trained, so %s keeps the figures of the run that "
                "trained the model",
                trained.steps,
                earlier,
            )
        return
    trainer.record(metrics)


def _export(trainer: Trainer) -> tuple[Path | None, outcome.ExportError | None]:
    """The weights first, before the work after training that can fail; a failed export (a full disk) leaves that
    work to be done, and is raised once it is."""
    try:
        return outcome.export(trainer), None
    except outcome.ExportError as err:
        if trainer.is_main:
            log.error(
                "export failed (%s); evaluating and writing metrics.json before exiting", one_line(err.__cause__ or err)
            )
        return None, err
