"""One run end to end: build -> fit -> evaluate -> record -> export, in the order the data flows."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from qa_train import outcome
from qa_train.config.settings import TrainArgs
from qa_train.observe.recorder import summary_table
from qa_train.observe.schema import RunMetrics
from qa_train.trainer import Trainer

log = logging.getLogger("qa_train")


class Preempted(Exception):
    """A stop request ended training early; its checkpoint is written and the run resumes from it."""


def run(args: TrainArgs) -> RunMetrics | None:
    """Train, evaluate, record and export (with --do_train false: evaluate and record). Returns metrics on the main
    process (None elsewhere)."""
    started = time.perf_counter()
    trainer = Trainer(args)
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

    scores = trainer.evaluate(Path(args.output.output_dir) / "eval_predictions.json") if args.eval.do_eval else None
    trainer.log_eval(scores)
    trainer.log_samples(scores)
    metrics = outcome.run_metrics(trainer, trained, scores, initial, started=started)
    if metrics is not None and metrics.squad_v2:
        log.info("SQuAD v2.0: %s", ", ".join(f"{k} {v:.4g}" for k, v in metrics.squad_v2.items()))
    trainer.record(metrics)  # before the export: a full disk there must not lose EM/F1
    if args.eval.do_predict:
        outcome.predict(trainer, scores)  # with the model the export will be: with --save_best, maybe not the last
    if trained is not None:  # an evaluation-only run exports nothing: its model is --model_name_or_path
        trainer.log_model(outcome.export(trainer, scores))
    trainer.finish()
    if metrics is not None:
        print(summary_table(metrics), flush=True)
    return metrics
