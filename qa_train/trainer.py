"""The Trainer: everything one run trains with, as named attributes; fit and evaluate are its phases, and each
returns what it did as a value (`TrainSummary`, `EvalResult`) for outcome.py to hand over: predictions,
metrics.json's figures, the export.

The loop never knows which strategy it runs under: that is the accelerate config's business, and
the strategy package's (qa_train/strategy/) where a library forces a difference.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from qa_train import __version__
from qa_train.config.outputdir import clear_previous_run
from qa_train.config.settings import TrainArgs, eval_interval, every_n_steps, unreached_intervals
from qa_train.core import collector, logs
from qa_train.core.preemption import StopRequest
from qa_train.data.batching import windows_in_step
from qa_train.data.loaders import TrainOrder, build_loaders, collator, featurize_splits
from qa_train.data.splits import Splits, load_splits
from qa_train.evaluation import (
    SAMPLE_COLUMNS,
    EvalResult,
    EvalSet,
    answer_and_score,
    predict_logits,
    sample_rows,
    write_predictions,
)
from qa_train.model.modeling import (
    CompileFigures,
    allow_graphs_per_width,
    check_checkpointing,
    check_positions,
    check_vocab,
    check_weights,
    compile_figures,
    compile_model,
    enable_checkpointing,
    flop_coefficients,
    import_model_code,
    load_model,
    load_model_config,
    load_tokenizer,
    loading,
    model_shape,
    uses_graphs_per_width,
    uses_token_types,
    window_losses,
)
from qa_train.model.optimization import (
    StepPlan,
    batches_per_rank,
    build_optimizer,
    global_batch_waste,
    hyperparameters,
    optimizer_order,
    reapply,
    step_plan,
)
from qa_train.observe.hostmem import HostMemory
from qa_train.observe.metrics import BatchCount, DeviceMemory, TrainSummary, device_name, peak_tflops
from qa_train.observe.monitor import ModelCost, TrainingMetrics, interval_log
from qa_train.observe.profiling import start_profiler
from qa_train.observe.progress import Progress, ProgressOutput
from qa_train.observe.recorder import Tracker
from qa_train.observe.schema import RunMetrics
from qa_train.observe.trackers import build_trackers
from qa_train.squad.postprocess import SpanRules
from qa_train.strategy import best, build, checkpoint, checks, deepspeed_json, faults, oom, resume, saving, sharded
from qa_train.strategy.train_state import CHECKPOINT_FORMAT, TrainerState, other_questions

log = logging.getLogger("qa_train")


def divergence_remedies(max_grad_norm: float, mixed_precision: str) -> str:
    """What may tame a divergence, less what the run already does: clipping at 1.0 is the default, and the
    bf16-for-fp16 advice is for fp16 runs alone."""
    remedies = ["a lower --learning_rate", "more warm-up (--warmup_ratio 0.1)"]
    if not 0 < max_grad_norm <= 1.0:
        remedies.append("--max_grad_norm 1.0")
    if mixed_precision == "fp16":
        remedies.append("bf16 instead of fp16")
    return ", ".join(remedies[:-1]) + ("," if len(remedies) > 2 else "") + f" or {remedies[-1]}"


class TrainingDiverged(RuntimeError):
    """Non-finite loss, gradients or weights: the run stops before anything non-finite is saved."""


def setup_logging(is_main: bool, bars: bool, level: str = "passive") -> None:
    """The main process logs at --log_level (passive: qa_train at info, the libraries at warning); the others
    warnings and errors only (the libraries' errors only)."""
    # transformers sets its own logger's level when its logging module is first imported: import it before setting.
    from transformers.utils import logging as hf_logging

    chosen = getattr(logging, level.upper(), logging.INFO)
    own = logging.INFO if level == "passive" else chosen
    libraries = logging.WARNING if level == "passive" else chosen
    logging.basicConfig(
        format=logs.FORMAT, datefmt=logs.DATE_FORMAT, level=own if is_main else logging.WARNING, force=True
    )
    logging.getLogger("qa_train").setLevel(own if is_main else logging.WARNING)
    for noisy in ("transformers", "datasets", "accelerate", "DeepSpeed", "torch.distributed"):
        logging.getLogger(noisy).setLevel(libraries if is_main else logging.ERROR)
    # DeepSpeed's ZeRO gathers and reduces through collectives torch deprecates: two lines each on every rank,
    # nothing to act on.
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` "
        "is deprecated",
        category=FutureWarning,
    )
    # Every rank loads weights (the model at start-up, --do_predict's kept best model) and writes the export, and
    # transformers draws a bar for each: the bars are the main process's alone, as its log lines are, and
    # --disable_tqdm turns off these as well as ours. Set both ways: a second run in one process gets its own.
    if is_main and bars:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()


class Trainer:
    """Builds the run in data-flow order: preflight (tokenizer, model limits, data) -> accelerator -> windows ->
    model and optimizer -> prepare -> resume -> tracker."""

    # torch DataLoaders until prepare() swaps in accelerate's (untyped) ones; None once finish() releases them.
    train_dl: Any
    eval_dl: Any

    def __init__(self, args: TrainArgs, splits: Splits | None = None) -> None:
        """`splits`: the data as `python -m qa_train` read it before the heavy imports; read here otherwise."""
        from accelerate.utils import set_seed

        self.output_dir = Path(args.output.output_dir)
        out = args.output
        self.request = resume.Request(out.resume_from_checkpoint, self.output_dir, out.allow_global_batch_change)
        # Before anything is sized by it: a checkpoint of another number of processes keeps its global batch.
        self.refit = resume.refit_accumulation(
            self.request,
            args.data.per_device_train_batch_size,
            args.optim.gradient_accumulation_steps,
            int(os.environ.get("WORLD_SIZE", "1")),
        )
        if self.refit is not None:
            args = replace(args, optim=replace(args.optim, gradient_accumulation_steps=self.refit.accumulation))
        self.args = args
        # Preflight on every rank before any process group: limits and records are refused in one line.
        m = args.model  # each caller names what it loads from (predict says MODEL_DIR)
        tokenizer_flag = "--tokenizer_name" if m.tokenizer_name else "--model_name_or_path"
        with loading(tokenizer_flag, m.tokenizer_source):
            self.tokenizer = load_tokenizer(m)
        config_flag = "--config_name" if m.config_name else "--model_name_or_path"
        with loading(config_flag, m.config_source):
            self.model_config = load_model_config(m)
        check_checkpointing(self.model_config, args.system.gradient_checkpointing)
        check_weights(m, self.model_config)
        if not m.from_scratch:  # from scratch, the embeddings are sized to the tokenizer
            check_vocab(
                self.model_config,
                self.tokenizer,
                f"{tokenizer_flag} {m.tokenizer_source}",
                f"{config_flag} {m.config_source}",
            )
        check_positions(self.model_config, self.tokenizer, args.data.max_seq_length, args.data.doc_stride)
        self.mixed_precision = build.launch_precision(args.system.mixed_precision)
        build.check_launcher_overrides(args)
        deepspeed_json.check_launch_json(args, self.mixed_precision)
        if args.system.tf32:
            build.enable_tf32()
        splits = load_splits(args) if splits is None else splits
        project = out.wandb_project
        assert project is not None  # OutputArgs.__post_init__ fills it in
        trackers = build_trackers(
            out.trackers,
            self.output_dir,
            project,
            {
                "name": out.run_name,
                "group": os.environ.get("WANDB_RUN_GROUP"),
                "job_type": os.environ.get("WANDB_JOB_TYPE"),
                "id": os.environ.get("WANDB_RUN_ID") or None,  # empty (`export WANDB_RUN_ID=`): wandb refuses ""
                "resume": "allow" if out.resume_from_checkpoint else None,
            },
            out.tensorboard_dir,
        )
        self.accelerator = build.make_accelerator(args, trackers, self.mixed_precision)
        self.is_main = self.accelerator.is_main_process
        setup_logging(self.is_main, bars=not args.output.disable_tqdm, level=args.system.log_level)
        if self.refit is not None and self.is_main:
            log.warning("%s", self.refit.message)
        checks.check_world(self.accelerator)
        checks.check_recompute(self.accelerator, args.system.gradient_checkpointing)
        checks.check_optimizer(self.accelerator, args.optim.optim)
        self.strategy = build.detect_strategy(self.accelerator)
        self.on_cuda = self.accelerator.device.type == "cuda"
        log.info(
            "qa_train %s: %s on %d process(es), device %s, mixed precision %s",
            __version__,
            self.strategy.name,
            self.accelerator.num_processes,
            self.accelerator.device,
            self.mixed_precision,
        )
        threads = checks.cpu_thread_warning(
            self.accelerator.device.type, torch.get_num_threads(), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        )
        if threads:
            log.warning(threads)
        self.stop = StopRequest(self.output_dir)
        set_seed(args.system.seed)
        self.host_memory = HostMemory(trim=not self.on_cuda)
        self.device_memory = DeviceMemory(self.accelerator.device)
        self._build_inputs(splits)
        self._build_model()
        self.state = self._resume()
        self.first_step = self.state.completed_steps
        self.device = device_name(self.accelerator.device)
        self.tracker = Tracker(self.accelerator, self.output_dir)
        self.tracker.start(project, self._run_config(), resumed_at=self.first_step)
        self._watch()
        cost = ModelCost(*flop_coefficients(self.model_config), peak_tflops(self.device, self.mixed_precision))
        self._metrics = TrainingMetrics(
            self.accelerator, self.device_memory, self.host_memory, cost, args.system.throughput_warmup_steps
        )
        # fp16's loss scaler expects overflowing gradients now and then and skips those steps itself.
        self.guard_grad_norm = self.mixed_precision != "fp16"
        self._update_lr: float | None = None  # the latest update's (the scheduler's is already the next one's)
        # Scores of other evaluation questions (resume_conflicts' note says so) are not compared with this run's.
        carried = self.resuming is not None and not other_questions(self.resuming.saved, self.now)
        self.best = best.BestModel(
            self.accelerator,
            self.output_dir,
            args.eval.save_best,
            self.first_step > 0 and carried,
            self.state.best_eval,
        )
        self._preempted = False

    # --- building ------------------------------------------------------------------------------

    def _build_inputs(self, splits: Splits) -> None:
        self.inputs = featurize_splits(self.accelerator, splits, self.args.data, self.tokenizer)
        self.token_types = uses_token_types(self.model_config, self.tokenizer)
        order = TrainOrder(self.args.system.seed, self.global_batch_size)
        self.train_dl, self.eval_dl = build_loaders(
            self.inputs, self.tokenizer, self.args.data, order, self.on_cuda, self.token_types
        )
        log.info("%s", self.inputs.describe())
        self.host_memory.trim()  # featurisation's transient Python objects
        self.eval_set = None
        examples, features = self.inputs.eval_examples, self.inputs.eval_features
        # Post-processing happens on the main process only; the eval loader exists exactly when these do.
        if self.eval_dl is not None and examples is not None and features is not None and self.is_main:
            self.eval_set = EvalSet.build(examples, features, self.args.data.max_seq_length)

    def _build_model(self) -> None:
        args, accelerator = self.args, self.accelerator
        import_model_code(self.model_config)
        self.host_memory.mark_baseline()  # training memory is what the run adds above this
        if self.inputs.train_features is not None and self.is_main:
            waste = global_batch_waste(
                args.optim,
                len(self.inputs.train_features),
                args.data.per_device_train_batch_size,
                accelerator.num_processes,
            )
            if waste is not None:
                log.warning(waste)
        self.steps = (
            step_plan(args.optim, batches_per_rank(len(self.train_dl), accelerator.num_processes))
            if self.train_dl is not None
            else StepPlan(updates_per_epoch=0, total_steps=0, num_epochs=0, warmup_steps=0)  # --do_train false
        )
        self.log_every = every_n_steps(args.output.logging_steps, self.steps.total_steps)
        self.eval_every = eval_interval(args, self.steps.total_steps)
        if self.is_main:
            for warning in unreached_intervals(args, self.steps.total_steps, self.steps.updates_per_epoch):
                log.warning(warning)
        with loading("--model_name_or_path", args.model.model_name_or_path or ""):  # a hub id's weights, offline
            model = load_model(args.model, self.tokenizer, self.model_config)
        # The checkpoint is checked against this run before anything is loaded; converted weights go in here,
        # before compile and prepare, so every strategy shards them as it would a fresh model's.
        self.now = self._contract()
        found = resume.checked(accelerator, self.request, self.now)
        # Only now, with every record read, every window built (the tokenizer refuses some texts), the model
        # loaded and the checkpoint to continue checked, may --overwrite_output_dir cost the old run.
        self._clear_previous_run()
        self.resuming = resume.before_prepare(accelerator, self.request, found, model, optimizer_order(model))
        if args.system.gradient_checkpointing:  # before compile and prepare, which wrap the layers it marks
            enable_checkpointing(model)
        self.graph_widths = 0  # CUDA graphs per padded width: how many widths, known to inductor after step one
        if args.system.torch_compile:
            dynamic = not args.data.pad_to_max_length
            compile_model(model, args.system, dynamic=dynamic, on_cuda=accelerator.device.type == "cuda")
            if uses_graphs_per_width(args.system, dynamic):
                self.graph_widths = collator(self.tokenizer, args.data).widths()
        if not args.eval.do_train:
            self._prepare_for_evaluation(model)
            return
        optimizer, scheduler = build_optimizer(accelerator, model, args, self.steps)
        deepspeed_json.reconcile_with_flags(accelerator, args, self.mixed_precision)
        sharded.fit_fsdp_wrap(accelerator, model)
        loaders = [self.train_dl] + ([self.eval_dl] if self.eval_dl is not None else [])
        self.model, self.optimizer, self.scheduler, *prepared = accelerator.prepare(
            model, optimizer, scheduler, *loaders
        )
        self.train_dl = prepared[0]
        self.eval_dl = prepared[1] if self.eval_dl is not None else None

    def _prepare_for_evaluation(self, model) -> None:
        """--do_train false: the model (and the evaluation loader) prepared without an optimizer, as Trainer's
        evaluation-only runs; no step is planned."""
        self.log_every = self.eval_every = 1
        self.optimizer = self.scheduler = None
        deepspeed_json.reconcile_with_flags(self.accelerator, self.args, self.mixed_precision)
        sharded.fit_fsdp_wrap(self.accelerator, model)
        self.model, self.eval_dl = build.prepare_for_evaluation(self.accelerator, model, self.eval_dl)

    def _clear_previous_run(self) -> None:
        cleared = clear_previous_run(self.args.output, self.is_main)
        if cleared.removed:
            log.info(
                "--overwrite_output_dir: removed the previous run's %s from %s",
                ", ".join(cleared.removed),
                self.output_dir,
            )
        if cleared.kept:
            log.warning(
                "--overwrite_output_dir: kept %s in %s: not provably qa_train's own",
                ", ".join(cleared.kept),
                self.output_dir,
            )

    def _contract(self) -> TrainerState:
        """A fresh state carrying what this run is and how it is sized: what a checkpoint must agree with."""
        return TrainerState(
            world_size=self.accelerator.num_processes,
            global_batch_size=self.global_batch_size,
            per_device_train_batch_size=self.args.data.per_device_train_batch_size,
            gradient_accumulation_steps=self.args.optim.gradient_accumulation_steps,
            total_steps=self.steps.total_steps,
            seed=self.args.system.seed,
            group_by_length=self.args.data.group_by_length,
            num_train_windows=len(self.inputs.train_features) if self.inputs.train_features is not None else 0,
            train_data=self.inputs.train_fingerprint,
            model_shape=model_shape(self.model_config),
            checkpoint_layout=build.checkpoint_layout(self.strategy, self.accelerator),
            checkpoint_format=CHECKPOINT_FORMAT,
            qa_train_version=__version__,
            answering=self.args.answering(),
            eval_data=self.inputs.eval_examples.fingerprint if self.inputs.eval_examples is not None else None,
        )

    def _resume(self) -> TrainerState:
        """A fresh state carrying this run's contract, or the checkpoint's counters once the contract holds."""
        if self.resuming is None:
            return self.now
        path = self.resuming.path
        fresh = hyperparameters(self.scheduler)
        state = resume.after_prepare(
            self.accelerator, self.resuming, self.model, self.optimizer, self.steps.updates_per_epoch
        )
        # The schedule is placed by the steps done: one saved by other processes (stepped once per process per
        # update), by DeepSpeed's engine or under another global batch would be off.
        position = state.completed_steps * deepspeed_json.scheduler_steps_per_update(self.accelerator)
        changed = reapply(self.scheduler, fresh, position)
        if self.is_main:
            checkpoint.set_aside_later(path, self.output_dir)
            if changed:
                log.warning(
                    "resuming from %s with this run's %s (the schedule continues at step %d)",
                    path,
                    ", ".join(changed),
                    state.completed_steps,
                )
        log.info(
            "resumed from %s at step %d (epoch %d, batch %d)",
            path,
            state.completed_steps,
            state.epoch,
            state.batches_in_epoch,
        )
        return state

    def _run_config(self) -> dict[str, object]:
        """The tracker's run config, laid out as Trainer's: the model's config, then every flag and what the launch
        resolved them to, and model/num_parameters."""
        return {
            **self.model_config.to_dict(),
            **self.args.to_dict(),
            **self.strategy.as_dict(),
            "world_size": self.accelerator.num_processes,
            "device": self.device,
            "mixed_precision": self.mixed_precision,
            "global_batch_size": self.global_batch_size,
            "total_steps": self.steps.total_steps,
            "qa_train_version": __version__,
            **build.resolved_config(self.accelerator),
            "model/num_parameters": sharded.num_parameters(self.accelerator.unwrap_model(self.model)),
        }

    def _watch(self) -> None:
        """WANDB_WATCH, as Trainer honours it: histograms every max(100, --logging_steps) steps; not where a rank
        holds only a shard of each weight, whose hooks would see the shard."""
        out, what = self.args.output, self.args.output.wandb_watch
        self._watch_every, self._backwards = 0, 0  # micro-batches between histograms, and those counted so far
        if self.is_main and out.log_model_when == "checkpoint" and out.checkpoint_every is None:
            log.warning("WANDB_LOG_MODEL=checkpoint: no checkpoint is written without --checkpointing_steps")
        if what is None or not self.is_main:
            return
        if self.strategy.shards_weights:
            log.warning(
                "WANDB_WATCH=%s: %s shards the weights, so W&B would see one shard; not watching",
                what,
                self.strategy.name,
            )
            return
        # W&B's hooks count backward passes: the optimizer-step interval times the micro-batches per step.
        self._watch_every = max(100, self.log_every) * self.args.optim.gradient_accumulation_steps
        self.tracker.watch(self.accelerator.unwrap_model(self.model), what, self._watch_every)

    @property
    def epoch(self) -> float:
        """Epochs trained so far, fractional within an epoch."""
        batches = len(self.train_dl) if self.train_dl is not None else 0
        return self.state.epoch + self.state.batches_in_epoch / max(batches, 1)

    @property
    def global_batch_size(self) -> int:
        return (
            self.args.data.per_device_train_batch_size
            * self.args.optim.gradient_accumulation_steps
            * self.accelerator.num_processes
        )

    # --- training ------------------------------------------------------------------------------

    def fit(self) -> TrainSummary:
        """Train to the planned step count, or until a stop request (then `finished` is False and the checkpoint is
        written); what this rank trained, as a value."""
        steps, system = self.steps, self.args.system
        log.info(
            "training %d steps (%d epochs of %d updates), global batch %d",
            steps.total_steps,
            steps.num_epochs,
            steps.updates_per_epoch,
            self.global_batch_size,
        )
        if self.state.eval_owed:  # the stopped run's last step owed an evaluation
            self._evaluate_during_training()
            self.state.eval_owed = False
        profiler = self._profiler() if system.profile else None
        self.progress = self._progress(
            "train", steps.total_steps, self.state.completed_steps, "step", self.global_batch_size
        )
        # What compiled before training (an earlier run in this process) is not this training's compile.
        before = compile_figures() if system.torch_compile else None
        t0 = time.perf_counter()
        self._metrics.start()  # loading, resuming and evaluation before this are not training
        self.model.train()
        while self.state.completed_steps < steps.total_steps and not self._preempted:
            self._train_epoch(profiler)
        self.progress.close()
        throughput = self._metrics.finish()
        if profiler is not None:
            profiler.stop()
        runtime_s = time.perf_counter() - t0
        machine = self._metrics.load.read()
        memory = self._metrics.memory()
        compiled = compile_figures().since(before) if before is not None else CompileFigures.nothing()
        if not self._preempted:
            self._check_weights()  # the last update is after the last loss that was read
        return TrainSummary(
            finished=not self._preempted,
            steps=self.state.completed_steps,
            runtime_s=runtime_s,
            checkpoint_s=self._metrics.checkpoint_s,
            last_loss=self._metrics.last_loss,
            throughput=throughput,
            memory=memory,
            compile_s=compiled.seconds,
            compiled_graphs=compiled.graphs,
            compile_cache_hits=compiled.cache_hits,
            compile_cache_misses=compiled.cache_misses,
            machine=machine,
        )

    def _profiler(self):
        return start_profiler(
            self.output_dir,
            self.args.system.throughput_warmup_steps,
            self.accelerator.process_index,
            self.is_main,
            self.on_cuda,
        )

    def _progress(self, label: str, total: int, done: int, unit: str, samples_per_unit: int) -> Progress:
        out = self.args.output
        shown = ProgressOutput(enabled=self.is_main and not out.disable_tqdm, interval_s=out.progress_interval_s)
        return Progress(label, total, done, unit, samples_per_unit, output=shown)

    def _train_epoch(self, profiler) -> None:
        state = self.state
        loader = (
            self.accelerator.skip_first_batches(self.train_dl, state.batches_in_epoch)
            if state.batches_in_epoch
            else self.train_dl
        )
        loader.set_epoch(state.epoch)  # the shuffle of epoch e is a function of (seed, e) alone
        for batch in loader:
            try:
                self._micro_step(batch)
            except (RuntimeError, MemoryError) as err:
                if not oom.is_out_of_memory(err):
                    raise
                samples, width = batch["input_ids"].shape
                raise oom.in_training_step(
                    err,
                    state.completed_steps + 1,
                    samples,
                    width,
                    self.args.optim.gradient_accumulation_steps,
                    oom.plan_command(self.args, self.mixed_precision),
                ) from err
            if self.accelerator.sync_gradients and self._after_update(profiler):
                break
        if self._preempted:
            return
        if state.completed_steps < self.steps.total_steps or state.batches_in_epoch >= len(self.train_dl):
            state.epoch += 1
            state.batches_in_epoch = 0
            if self.args.eval.eval_strategy == "epoch":
                self._evaluate_during_training()
            if self.args.output.checkpoint_every == "epoch":
                self._save_checkpoint()

    def _micro_step(self, batch: dict[str, torch.Tensor]) -> None:
        real, padded = batch.pop("num_tokens")
        samples = int(batch.pop("num_windows"))  # a Python int: the collator's, never moved to the device
        batch.pop("feature_index")
        weights, starts, ends = batch.pop("real"), batch.pop("start_positions"), batch.pop("end_positions")
        accelerator, max_norm = self.accelerator, self.args.optim.max_grad_norm
        with accelerator.accumulate(self.model):
            self._open_watched_step()
            losses = window_losses(self.model(**batch), starts, ends, batch["attention_mask"])
            loss = (losses * weights).sum() * self._step_weight()
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                # Only a clipping run measures the norm (as transformers' Trainer): measuring costs a pass.
                clipped = accelerator.clip_grad_norm_(self.model.parameters(), max_norm) if max_norm > 0 else None
                self._metrics.update(sharded.global_grad_norm(accelerator, self.model, clipped))
                self._update_lr = self.scheduler.get_last_lr()[0]
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.state.batches_in_epoch += 1
        width = batch["input_ids"].shape[1]
        self._metrics.micro_batch(
            loss, BatchCount(samples, real, padded, self._metrics.cost.batch_flops(padded, width))
        )

    def _open_watched_step(self) -> None:
        """Before the micro-batch whose forward and backward passes W&B's hooks log (parameters, gradients): open
        its step's row. (Evaluation's forward passes count for the parameters' hook too.)"""
        if self._watch_every:
            self._backwards += 1
            if self._backwards % self._watch_every == 0:
                self.tracker.open_step(self.state.completed_steps + 1)

    def _step_weight(self) -> float:
        """An update is the mean gradient over its step's windows, whichever rank and micro-batch holds each: a
        micro-batch's loss is its windows' sum x processes x accumulation / the step's windows, which accelerate (and
        DeepSpeed's engine) divide by the accumulation and the ranks average. A whole step is the usual mean; an
        epoch's last step has fewer windows (the rest pad it, weighted 0), counted alike on any number of processes.
        Steps start with the epoch, so the current one is known from the micro-batches consumed."""
        accumulation = self.args.optim.gradient_accumulation_steps
        step = self.state.batches_in_epoch // accumulation
        assert self.inputs.train_features is not None  # only a training run takes steps
        windows = windows_in_step(step, len(self.inputs.train_features), self.global_batch_size)
        return self.accelerator.num_processes * accumulation / max(windows, 1)

    def _after_update(self, profiler) -> bool:
        """Count the update, log, checkpoint; True when the epoch loop must end (done or stopping)."""
        state, out = self.state, self.args.output
        state.completed_steps += 1
        if state.completed_steps == self.first_step + 1 and self.graph_widths:
            allow_graphs_per_width(self.graph_widths)  # now that the step is compiled: see there
        if state.completed_steps == self.first_step + max(self.args.system.throughput_warmup_steps, 1):
            collector.settle()  # what the first steps made (compiled graphs, optimizer state) lives to the end too
        self._metrics.optimizer_step()  # after the settle: its collection is no timed step's
        if profiler is not None:
            profiler.step()
        self.stop.hold_if_asked(state.completed_steps, self.accelerator.process_index)
        logging_step = state.completed_steps % self.log_every == 0 or state.completed_steps == self.steps.total_steps
        if logging_step:
            stopping = self._log_interval()
        else:  # a stop asked for during start-up (minutes on SQuAD) must not wait --logging_steps more steps
            stopping = state.completed_steps == self.first_step + 1 and bool(
                faults.failed_ranks(self.accelerator, self.stop.requested())
            )
        self.progress.update()  # after the log, so the line carries this step's loss
        if stopping:
            # The checkpoint comes first (the grace period is short); the evaluation this step owes waits for
            # the resumed run.
            state.eval_owed = self._eval_due(state.completed_steps)
            self._save_checkpoint()
            self.stop.clear(self.is_main)
            self._preempted = True
            return True
        if self._eval_due(state.completed_steps):
            self._evaluate_during_training()
        every = out.checkpoint_every
        if isinstance(every, int) and state.completed_steps % every == 0:
            self._save_checkpoint()
        return state.completed_steps >= self.steps.total_steps

    def _log_interval(self) -> bool:
        """The only host sync of the loop: the interval's figures over all ranks, and whether any rank must stop."""
        figures = self._metrics.collect(self.stop.requested())
        bad_norms = figures.bad_grad_norms if self.guard_grad_norm else 0
        if not math.isfinite(figures.loss) or bad_norms:  # every rank sees the same figures: all stop together
            what = (
                f"loss is {figures.loss}"
                if not math.isfinite(figures.loss)
                else (f"{bad_norms} gradient norm(s) were not finite")
            )
            raise TrainingDiverged(self._diverged(what))
        lr = self.scheduler.get_last_lr()[0]
        self.progress.note(loss=figures.loss, lr=lr)
        self.tracker.log_step(self.state.completed_steps, interval_log(figures, self._metrics.cost, lr, self.epoch))
        return figures.stop_requested

    def _eval_due(self, step: int) -> bool:
        return self.args.eval.eval_strategy == "steps" and step % self.eval_every == 0

    def _evaluate_during_training(self) -> None:
        if self.state.completed_steps >= self.steps.total_steps and self.args.eval.do_eval:
            return  # the final evaluation follows
        with self._metrics.excluded("evaluation"):
            result = self.evaluate()
            if result is not None:  # the terminal and a SLURM log see each score, not only the trackers
                log.info(
                    "evaluation at step %d (epoch %.2f): exact_match %.2f, f1 %.2f",
                    self.state.completed_steps,
                    self.epoch,
                    result.exact_match,
                    result.f1,
                )
            self.log_eval(result)
            self.best.offer(result, self.state.completed_steps, self.export_to)

    def log_eval(self, result: EvalResult | None) -> None:
        """eval/* against the current step (main process; None elsewhere)."""
        if result is not None:
            self.tracker.log_step(
                self.state.completed_steps,
                {"eval/exact_match": result.exact_match, "eval/f1": result.f1, "eval/runtime_s": result.runtime_s},
            )

    def log_samples(self, result: EvalResult | None, limit: int = 100) -> None:
        """A W&B table of evaluation questions: question, gold, prediction, EM, F1 (main process)."""
        if result is not None and result.predictions is not None and self.eval_set is not None:
            rows = sample_rows(self.eval_set.examples, result.predictions, limit, v2=result.squad_v2 is not None)
            self.tracker.log_table("eval/samples", SAMPLE_COLUMNS, rows, self.state.completed_steps)

    @property
    def _model_artifact(self) -> str:
        return f"model-{self.args.output.run_name or 'qa_train'}"

    def log_model(self, folder: Path | None) -> None:
        """The export as a W&B artifact: --wandb_log_model, or WANDB_LOG_MODEL=end or checkpoint."""
        if self.args.output.log_model_when is None:
            return
        if folder is None:
            if self.is_main:
                log.warning("WANDB_LOG_MODEL: no model was exported (--save_final_model false), so none is logged")
            return
        self.tracker.log_model(folder, self._model_artifact)

    def export_to(self, folder: Path) -> Path:
        """The consolidated model and tokenizer in `folder` (every rank must call it): the export, and
        --save_best's copies."""
        return saving.export_final(self.accelerator, self.model, self.tokenizer, folder, self.args.answering())

    def _save_checkpoint(self) -> None:
        # A save's time depends on the disk and --checkpointing_steps, not on the strategy's step: it is reported
        # apart (checkpoint_runtime_s) instead of diluting samples/s.
        with self._metrics.excluded("checkpoint"):
            self._check_weights()
            self.state.best_eval = self.best.as_record()
            path = saving.save_checkpoint(
                self.accelerator, self.output_dir, self.state, self.args.output.save_total_limit
            )
            if self.args.output.log_model_when == "checkpoint":
                self.tracker.log_checkpoint(path, self._model_artifact, self.state.completed_steps, self.epoch)

    def _check_weights(self) -> None:
        """Non-finite weights are never checkpointed or exported (each rank checks what it holds)."""
        bad = sharded.nonfinite_tensors(self.model.parameters(), self.accelerator.device)
        if self.accelerator.reduce(bad, reduction="sum").item() > 0:
            raise TrainingDiverged(self._diverged("the weights hold NaN or Inf values"))

    def _diverged(self, what: str) -> str:
        done = checkpoint.complete_checkpoints(self.output_dir)
        kept = f"the last checkpoint, {done[-1]}, is from before it" if done else "no checkpoint was saved"
        lr = self.scheduler.get_last_lr()[0] if self._update_lr is None else self._update_lr
        return (
            f"training diverged at step {self.state.completed_steps}: {what} (learning rate {lr:.3g}); nothing was "
            f"exported and {kept}. Try {divergence_remedies(self.args.optim.max_grad_norm, self.mixed_precision)}"
        )

    # --- evaluation, record, finish ------------------------------------------------------------

    def evaluate(self, predictions_path: Path | None = None) -> EvalResult | None:
        """EM/F1 on the main process (None elsewhere, and without an eval split); every rank must call it."""
        if self.eval_dl is None:
            return None
        t0 = time.perf_counter()
        progress = self._progress(
            "eval",
            len(self.eval_dl),
            0,
            "batch",
            self.args.data.per_device_eval_batch_size * self.accelerator.num_processes,
        )
        logits = predict_logits(
            self.accelerator, self.model, progress.over(self.eval_dl), self.args.data.max_seq_length, self.host_memory
        )
        progress.close()
        self.host_memory.trim()  # evaluation's transient logits and batches
        if self.eval_set is None:
            return None
        answers, result = answer_and_score(self.eval_set, logits, SpanRules.of(self.args.answering()))
        if predictions_path is not None:
            write_predictions(predictions_path, answers)
        result.runtime_s = round(time.perf_counter() - t0, 3)
        return result

    def record(self, metrics: RunMetrics | None) -> None:
        """metrics.json and the tracker's summary (main process), after the export (run.py: the weights first)."""
        if metrics is not None:
            self.tracker.finish(metrics)

    def finish(self) -> None:
        """Close the tracker, then leave the process group together."""
        self.tracker.close()
        self.accelerator.wait_for_everyone()
        # DDP's reducer holds the gloo group; left to interpreter shutdown, the group's destructor can wait on
        # a gloo thread that waits for the GIL (seen once: a hung rank after its summary). Freed here, while
        # threads still get the GIL.
        self.model = self.optimizer = self.scheduler = self.train_dl = self.eval_dl = None
        self.accelerator.free_memory()
        # free_memory collects before it drops its own references: FSDP2's modules, cycles holding the group's work,
        # would outlive the group and be torn down with the interpreter, where a gloo thread wanting the GIL aborts
        # the rank (seen once in CI). `python -m qa_train` skips that teardown (core/teardown.py); a process that
        # calls main() as a library does not.
        if self.accelerator.num_processes > 1:
            collector.thaw()  # the model's cycles were frozen with the build
            gc.collect()
        self.accelerator.end_training()
