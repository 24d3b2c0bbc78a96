"""What a fitted run hands over: answers to --test_file, metrics.json's figures, and the exported model.

Each is a phase of the run after `Trainer.fit` (run.py calls them in order), working from what the trainer was
built with and what fit and evaluation returned; every rank calls each one (they gather or save collectively).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from qa_train import __version__
from qa_train.config.settings import ModelArgs
from qa_train.core.errors import one_line
from qa_train.data.loaders import collator, inference_loader
from qa_train.evaluation import EvalResult, EvalSet, answer, predict_logits, write_answers
from qa_train.model.modeling import load_model, load_model_config, resolve_attention
from qa_train.observe.metrics import (
    RankFigures,
    TrainSummary,
    gather_figures,
    peak_tflops,
    slowest_startup,
    summarize,
)
from qa_train.observe.schema import PerRank, RunMetrics
from qa_train.observe.startup import Startup
from qa_train.squad.postprocess import SpanRules
from qa_train.strategy import best, faults, sharded
from qa_train.trainer import Trainer

log = logging.getLogger("qa_train")


class ExportError(RuntimeError):
    """The final model could not be written; metrics.json already was."""


def predict(t: Trainer, final_scores: EvalResult | None) -> Path | None:
    """Answer --test_file (every rank must call it) with the model the export will be: the kept best one when
    it replaces the last (`final_scores` as `export` takes them), else the trained one. Writes
    predict_predictions.json and predict_nbest_predictions.json on the main process, which returns the
    predictions file."""
    from accelerate.utils import release_memory

    data, examples, features = t.args.data, t.inputs.test_examples, t.inputs.test_features
    assert examples is not None and features is not None  # --do_predict reads --test_file before training
    loader = t.accelerator.prepare_data_loader(
        inference_loader(features, collator(t.tokenizer, data, t.token_types), data, t.on_cuda)
    )
    if not t.best.replaces_last(final_scores):
        logits = predict_logits(t.accelerator, t.model, loader, data.max_seq_length, t.host_memory)
    else:
        kept = _best_for_inference(t)
        # The trained model's forward carries the autocast prepare() gave it; the copy gets the same here
        # (none under DeepSpeed, whose engine casts weights instead: there the copy answers in fp32).
        with t.accelerator.autocast():
            logits = predict_logits(t.accelerator, kept, loader, data.max_seq_length, t.host_memory)
        (kept,) = release_memory(kept)  # before the export, which under ZeRO-3 gathers the whole model
    t.host_memory.trim()
    if not t.is_main:
        return None
    test_set = EvalSet.build(examples, features, data.max_seq_length)
    path = write_answers(t.output_dir, "predict", answer(test_set, logits, SpanRules.of(t.args.answering())))
    log.info("predict: %d questions answered -> %s", len(examples), path)
    return path


def _best_for_inference(t: Trainer) -> torch.nn.Module:
    """The kept best model (output_dir/best), in fp32 on this rank's device, for inference alone: loaded beside
    the trained one, which under ZeRO-3 or FSDP is sharded and cannot simply take its weights. Left unwrapped
    (no DDP, no DeepSpeed engine), so its forward needs no collective."""
    score = t.best.kept
    assert score is not None  # replaces_last: there is a kept model
    log.info("predict: answering with the best model (step %d, F1 %.2f)", score.step, score.f1)
    source = ModelArgs(
        model_name_or_path=str(t.output_dir / "best"),
        attn_implementation=resolve_attention(t.args.model, t.model_config),
    )
    with sharded.built_whole(t.accelerator):
        model = load_model(source, t.tokenizer, load_model_config(source))
    return model.to(t.accelerator.device)


def export(t: Trainer) -> Path | None:
    """The trained model and tokenizer, consolidated, in output_dir/final (every rank must call it), right after
    training: the final evaluation, --do_predict and metrics.json come after it, and a failure there (out of
    memory, a full disk) must not lose the weights. ExportError on every rank when it fails; the run then still
    evaluates and records, and says so at its end."""
    if not t.args.output.save_final_model:
        return None
    try:
        return t.export_to(t.output_dir / "final")
    except Exception as err:  # a full disk surfaces as OSError, or as safetensors' own error type
        if faults.run_fault(err):
            raise  # not the export's fault: exit 7 or 6, as anywhere else in the run
        raise ExportError(
            f"export to {t.output_dir / 'final'} failed: {one_line(err)}; "
            "metrics.json is written, and the last checkpoint (if any) still holds the "
            "weights"
        ) from err


def keep_best(t: Trainer, final_scores: EvalResult | None, exported: Path | None) -> Path | None:
    """With --save_best, the export becomes the best model evaluated when an earlier evaluation scored a higher F1
    than the final one (every rank must call it); returns where the export is."""
    if not t.args.output.save_final_model:
        return None
    if t.best.replaces_last(final_scores):
        t.accelerator.wait_for_everyone()
        kept = t.best.kept
        assert kept is not None  # replaces_last: there is a kept model
        if t.is_main:
            best.promote(t.output_dir)
            log.info("exported the best model (step %d, F1 %.2f) to %s", kept.step, kept.f1, t.output_dir / "final")
        return t.output_dir / "final"
    if exported is not None and t.is_main:  # the last model is the export; a failed one leaves best/ its weights
        shutil.rmtree(t.output_dir / "best", ignore_errors=True)
    return exported


def run_metrics(
    t: Trainer,
    trained: TrainSummary | None,
    final: EvalResult | None,
    initial: EvalResult | None,
    *,
    started: float,
    startup: Startup,
) -> RunMetrics | None:
    """metrics.json's content, complete, on the main process (None elsewhere): every rank's `trained` gathered (a
    collective: every rank must call it), the final and initial evaluations' results, and what the run was.
    `trained` is None for an evaluation-only run (--do_train false): no training figure is reported, not even a
    zero. `started`: time.perf_counter() when the run began, for total_runtime_s; `startup`: this rank's."""
    mine = RankFigures.measured(trained, startup) if trained else RankFigures.untrained(startup)
    ranks = gather_figures(t.accelerator, mine)
    if not t.is_main:
        return None
    if trained is None:
        return _evaluation_metrics(t, final, ranks, started)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", t.accelerator.num_processes))
    figures = summarize(ranks, peak_tflops(t.device, t.mixed_precision), t.on_cuda, per_node)
    inputs = t.inputs
    return RunMetrics(
        **{f.name: getattr(figures, f.name) for f in dataclasses.fields(figures)},
        exact_match=final.exact_match if final else None,
        f1=final.f1 if final else None,
        **t.best.fields(final, trained.steps, t.args.output.save_final_model),
        initial_exact_match=initial.exact_match if initial else None,
        initial_f1=initial.f1 if initial else None,
        initial_eval_step=t.first_step if initial else None,
        squad_v2=final.squad_v2 if final else None,
        train_runtime_s=round(trained.runtime_s, 3),
        checkpoint_runtime_s=round(trained.checkpoint_s, 3),
        eval_runtime_s=final.runtime_s if final else None,
        total_runtime_s=round(time.perf_counter() - started, 3),
        **_startup_metrics(slowest_startup(ranks)),
        train_steps=trained.steps,
        train_loss=trained.last_loss if math.isfinite(trained.last_loss) else None,  # NaN: no step was logged
        train_loss_per_rank=[r.last_loss if math.isfinite(r.last_loss) else None for r in ranks],
        num_train_examples=inputs.num_train_examples,
        num_train_features=len(inputs.train_features) if inputs.train_features is not None else 0,
        global_batch_size=t.global_batch_size,
        per_device_train_batch_size=t.args.data.per_device_train_batch_size,
        **_run_description(t),
    )


def _evaluation_metrics(t: Trainer, final: EvalResult | None, ranks: list[RankFigures], started: float) -> RunMetrics:
    """An evaluation-only run's metrics.json: its scores, what it ran on, and no training figure (None)."""
    return RunMetrics(
        peak_host_rss_gb=PerRank.of([r.lifetime_rss_gib for r in ranks]),
        exact_match=final.exact_match if final else None,
        f1=final.f1 if final else None,
        squad_v2=final.squad_v2 if final else None,
        eval_runtime_s=final.runtime_s if final else None,
        total_runtime_s=round(time.perf_counter() - started, 3),
        **_startup_metrics(slowest_startup(ranks)),
        **_run_description(t),
    )


def _startup_metrics(startup: Startup) -> dict[str, Any]:
    def seconds(value: float) -> float | None:
        return None if math.isnan(value) else round(value, 3)

    return {
        "startup_s": seconds(startup.total_s),
        "startup_launch_s": seconds(startup.launch_s),
        "startup_process_s": seconds(startup.process_s),
        "startup_build_s": seconds(startup.build_s),
    }


def _run_description(t: Trainer) -> dict[str, Any]:
    """What every run's metrics.json says of the run itself, trained or not."""
    inputs, s = t.inputs, t.strategy
    return dict(
        world_size=t.accelerator.num_processes,
        strategy=s.name,
        zero_stage=s.zero_stage,
        offload=s.offload,
        distributed_type=s.distributed_type,
        mixed_precision=t.mixed_precision,
        device=t.device,
        num_parameters=sharded.num_parameters(t.accelerator.unwrap_model(t.model)),
        num_eval_examples=len(inputs.eval_examples) if inputs.eval_examples else 0,
        num_eval_features=len(inputs.eval_features) if inputs.eval_features else 0,
        max_seq_length=t.args.data.max_seq_length,
        output_dir=str(t.output_dir),
        qa_train_version=__version__,
        args=t.args.to_dict(),
    )
