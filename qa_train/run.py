"""One run end to end: build -> fit -> evaluate -> export -> report, in the order the data flows."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from qa_train.config import TrainArgs
from qa_train.schema import RunMetrics
from qa_train.tracking import summary_table
from qa_train.trainer import Trainer

log = logging.getLogger("qa_train")


def run(args: TrainArgs) -> RunMetrics | None:
    """Train, evaluate, export and report. Returns metrics on the main process (None elsewhere or when preempted)."""
    t_start = time.perf_counter()
    trainer = Trainer(args)
    initial = trainer.evaluate() if args.eval.eval_before_training else None
    if initial is not None:
        log.info("before training: exact_match %.2f, f1 %.2f", initial.exact_match, initial.f1)

    if not trainer.fit():
        log.warning("stop requested: checkpoint saved at step %d; rerun with --resume_from_checkpoint latest",
                    trainer.state.completed_steps)
        trainer.finish(None)
        return None

    scores = trainer.evaluate(Path(args.output.output_dir) / "eval_predictions.json") if args.eval.do_eval else None
    trainer.export()
    metrics = trainer.metrics(scores, initial)
    if metrics is not None:
        metrics.total_runtime_s = round(time.perf_counter() - t_start, 3)
    trainer.finish(metrics)
    if metrics is not None:
        print(summary_table(metrics), flush=True)
    return metrics
