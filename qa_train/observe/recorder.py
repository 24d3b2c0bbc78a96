"""What a run records, on the main process: the per-step log, metrics.json, and through accelerate's
trackers (trackers.py) the interval metrics, the config, the summary and W&B's table and model artifact."""

from __future__ import annotations

import glob
import json
import logging
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qa_train.observe.schema import RunMetrics

log = logging.getLogger("qa_train")

# Trainer's x-axis (transformers' WandbCallback): logged with every W&B record and declared the step of every key.
GLOBAL_STEP = "train/global_step"
# The trackers get Trainer's names where a figure means what Trainer's does (transformers' rewrite_logs: `eval_runtime`
# -> eval/runtime): what W&B and TensorBoard users look for. The step log (train_log.jsonl), which the dashboard
# reads, keeps qa_train's own names.
TRAINER_NAMES = {"train/lr": "train/learning_rate", "eval/runtime_s": "eval/runtime"}
# metrics.json's figures that the trackers' history already holds: the W&B summary has each once, under the
# history's key (W&B keeps every history key's last value in the summary by itself).
IN_HISTORY = {
    "exact_match": "eval/exact_match",
    "f1": "eval/f1",
    "eval_runtime_s": "eval/runtime",
    "train_loss": "train/loss",
}


def tracker_keys(values: dict[str, float]) -> dict[str, float]:
    return {TRAINER_NAMES.get(k, k): v for k, v in values.items()}


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """`write` fills a temporary file beside `path`, which is then renamed over it. A failed write removes the
    temporary file, and one that failed with an OSError (a full disk) names `path`: write() reports no file name."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and (err.filename is None or err.filename == str(tmp)):
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text))


def atomic_write_json(path: Path, payload: Any) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


class Tracker:
    """The run's records. Every rank may call every method; only the main process writes."""

    def __init__(self, accelerator: Any, output_dir: Path) -> None:
        self.accelerator = accelerator
        self.enabled = accelerator.is_main_process
        self.output_dir = output_dir
        self.step_log = output_dir / "train_log.jsonl"
        self.wandb_floor = 0  # the lowest step the W&B run still takes (above 0 when it continues an earlier run)
        self.metrics: RunMetrics | None = None

    def start(self, project: str, config: dict[str, Any], resumed_at: int) -> None:
        """Start the trackers; a resumed run (resumed_at > 0) keeps its step log up to its checkpoint's step."""
        if not self.enabled:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        logged_up_to = 0
        if resumed_at:
            logged_up_to = forget_steps_after(self.step_log, resumed_at)
        elif self.step_log.exists():
            self.step_log.unlink()
        self.accelerator.init_trackers(project, config)
        self._wandb("resume", lambda run: self._continue_wandb_run(run, resumed_at, logged_up_to))

    def _continue_wandb_run(self, run: Any, resumed_at: int, logged_up_to: int) -> None:
        """W&B drops (with a warning per call) any step below the last one its run holds. A resumed run logs
        again from its checkpoint's step, so when its W&B run is the interrupted one (the same id, as
        WANDB_RUN_ID gives across SLURM requeues) the steps that one already logged are not sent to W&B."""
        self.wandb_floor = wandb_floor(run, self.output_dir, logged_up_to)
        if self.wandb_floor > resumed_at:
            log.warning(
                "W&B run %s already holds steps up to %d (logged by the interrupted run with this id): this "
                "run, resumed at step %d, sends W&B only its steps after %d; the others go to %s and the "
                "other trackers",
                getattr(run, "id", "?"),
                self.wandb_floor - 1,
                resumed_at,
                self.wandb_floor - 1,
                self.step_log.name,
            )

    def _wandb(self, what: str, fn: Any) -> None:
        """fn(run) on the live W&B run, if there is one; a failure warns and leaves the run as it is."""
        found = [t for t in self.accelerator.trackers if t.name == "wandb"] if self.enabled else []
        if found and found[0].tracker is not None:
            found[0].call(what, lambda: fn(found[0].tracker), fatal=False)

    def log_step(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        try:
            with self.step_log.open("a") as f:
                f.write(json.dumps({"step": step, **values}) + "\n")
        except OSError as err:  # a full disk: write() and its flush name no file; the error line names it
            if err.filename is not None:
                raise
            raise OSError(err.errno, err.strerror, str(self.step_log)) from err
        shown = tracker_keys(values)
        if step >= self.wandb_floor:
            self.accelerator.log(shown, step=step)
            return
        for tracker in self.accelerator.trackers:  # as accelerator.log does, less the W&B run that has this step
            if tracker.name != "wandb":
                tracker.log(shown, step=step)

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """A W&B Table (other trackers have no table type: the rows are in the predictions file)."""

        def table(run: Any) -> None:
            import wandb

            # Table annotates columns as list[str | int], which a list[str] is not (lists are invariant).
            values = wandb.Table(columns=columns, data=rows)  # type: ignore[arg-type]
            # A step the W&B run already holds (a resumed run with nothing left to train) would drop the table;
            # no step at all would be W&B's own count, which an offline run starts at 0.
            at = max(step, self.wandb_floor)
            run.log({key: values, GLOBAL_STEP: at}, step=at)

        self._wandb("table", table)

    def log_model(self, folder: Path, name: str) -> None:
        """The exported model as a W&B artifact (type model), uploaded with the run or by `wandb sync`; its
        metadata says which step the export is (with --save_best maybe not the last) and its scores."""

        def artifact(run: Any) -> None:
            import wandb

            art = wandb.Artifact(artifact_name(name), type="model", metadata=self._model_metadata(folder))
            art.add_dir(str(folder))
            run.log_artifact(art, aliases=["final"])

        self._wandb("model artifact", artifact)

    def log_checkpoint(self, folder: Path, name: str, step: int, epoch: float) -> None:
        """A checkpoint as a version of the run's model artifact (WANDB_LOG_MODEL=checkpoint), with Trainer's
        aliases; uploaded with the run or by `wandb sync`."""

        def artifact(run: Any) -> None:
            import wandb

            art = wandb.Artifact(artifact_name(name), type="model", metadata={"path": str(folder), "step": step})
            art.add_dir(str(folder))
            run.log_artifact(art, aliases=[f"epoch_{round(epoch, 2)}", f"checkpoint_global_step_{step}"])

        self._wandb("checkpoint artifact", artifact)

    def watch(self, model: Any, what: str, every: int) -> None:
        """W&B's gradient and/or parameter histograms every `every` backward passes (WANDB_WATCH, as Trainer honours
        it); `open_step` puts them in their step's row."""
        self._wandb("watch", lambda run: run.watch(model, log=what, log_freq=every))

    def open_step(self, step: int) -> None:
        """Open W&B's row for `step` before its backward pass: WANDB_WATCH's hooks log without a step, into the row
        W&B holds open, which would otherwise be the last logged step's."""
        if step >= self.wandb_floor:
            self._wandb("watch", lambda run: run.log({GLOBAL_STEP: step}, step=step, commit=False))

    def _model_metadata(self, folder: Path) -> dict[str, Any]:
        m = self.metrics
        if m is None or m.exported_step is None:
            return {"path": str(folder)}
        if m.exported_step == m.train_steps:
            scores = (m.exact_match, m.f1)
        elif m.exported_step == m.best_eval_step:  # --save_best kept an earlier model
            scores = (m.best_exact_match, m.best_f1)
        else:
            scores = (None, None)
        return {"path": str(folder), "step": m.exported_step, "exact_match": scores[0], "f1": scores[1]}

    def finish(self, metrics: RunMetrics) -> None:
        """metrics.json, and the same figures as the W&B run's summary."""
        if not self.enabled:
            return
        self.metrics = metrics
        payload = metrics.to_json()
        atomic_write_json(self.output_dir / "metrics.json", payload)
        self._wandb("summary", lambda run: run.summary.update(wandb_summary(payload)))

    def close(self) -> None:
        """End every tracker's run once (accelerate's end_training then finds them ended)."""
        if self.enabled:
            for tracker in self.accelerator.trackers:
                tracker.finish()


def wandb_summary(payload: dict[str, Any]) -> dict[str, Any]:
    """metrics.json as the W&B summary: flat, without the flags (the run config holds them), each figure once (under
    the history's key where the history has it), and no null (a figure this run does not have is left out)."""
    flat = _flatten(payload)
    return {IN_HISTORY.get(k, k): v for k, v in flat.items() if v is not None and not k.startswith("args/")}


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested keys joined by "/"; lists (per-rank figures) left out, and so is a per_rank that is None, so that
    the summary has the same keys on every device."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}/"))
        elif not isinstance(value, list) and not name.endswith("per_rank"):
            out[name] = value
    return out


def wandb_floor(run: Any, output_dir: Path, logged_up_to: int) -> int:
    """The lowest step `run` takes: past the last step of the run it resumes (W&B says so when it resumed an online
    run), or past the interrupted run's last logged step when an earlier run of this id wrote into output_dir/wandb
    (offline, W&B knows nothing of it until `wandb sync`)."""
    floor = int(getattr(run, "starting_step", 0) or 0) if getattr(run, "resumed", False) else 0
    run_id, run_dir = getattr(run, "id", None), getattr(run, "dir", None)
    if logged_up_to and run_id:
        here = Path(run_dir).parent if run_dir else None
        if any(d != here for d in (output_dir / "wandb").glob(f"*run-*-{glob.escape(run_id)}")):
            floor = max(floor, logged_up_to + 1)
    return floor


def artifact_name(name: str) -> str:
    """W&B refuses an artifact name with characters other than letters, digits, '-', '_' and '.', or over 128
    characters; --run_name (by default the output dir's name) may hold any."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)[:128]


def _fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}{unit}"
    return f"{value}{unit}"


def _percent(fraction: float | None) -> str:
    return _fmt(None if fraction is None else 100 * fraction, "%", digits=1)


def summary_table(m: RunMetrics) -> str:
    """One screen: what a user compares strategies by. Memory in GiB, as every *_gb field of metrics.json."""
    rows = _evaluation_rows(m) if evaluation_only(m) else _training_rows(m)
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 60)
    return "\n".join([line, *(f"{k:<{width}}  {v}" for k, v in rows), line])


def evaluation_only(m: RunMetrics) -> bool:
    """A run of --do_train false (runs from before the flag trained)."""
    return m.args.get("do_train") is False


def _strategy_row(m: RunMetrics) -> tuple[str, str]:
    return (
        "strategy",
        f"{_fmt(m.strategy)} (zero_stage={_fmt(m.zero_stage)}, offload={_fmt(m.offload)}), "
        f"world_size={_fmt(m.world_size)}, {_fmt(m.mixed_precision)}",
    )


def _evaluation_rows(m: RunMetrics) -> list[tuple[str, str]]:
    """An evaluation-only run (--do_train false): what was scored, on what, and how long it took; nothing trained."""
    model = m.args.get("model_name_or_path")
    scored = [
        ("exact match / F1", f"{_fmt(m.exact_match)} / {_fmt(m.f1)}"),
        (
            "questions",
            f"{_fmt(m.num_eval_examples)} in {_fmt(m.num_eval_features)} windows of {_fmt(m.max_seq_length)} max",
        ),
    ]
    return [
        _strategy_row(m),
        ("model", f"{_fmt(model)} (--do_train false: nothing trained, nothing exported)"),
        *(scored if m.num_eval_examples else [("evaluation", "none (--do_eval false); answers to --test_file only")]),
        ("peak host RSS", f"max {_fmt(m.peak_host_rss_gb.max, ' GiB')} per rank (lifetime)"),
        ("runtime", f"{_fmt(m.eval_runtime_s, ' s')} evaluating, {_fmt(m.total_runtime_s, ' s')} total"),
        *_startup_rows(m),
        ("output", _fmt(m.output_dir)),
    ]


def _compile_rows(m: RunMetrics) -> list[tuple[str, str]]:
    """What --torch_compile cost and whether it built its kernels or loaded them (the cache unsaid where no inductor
    graph was met: another backend); none without compiling."""
    if m.compile_time_s is None:
        return []
    hits, misses = m.compile_cache_hits or 0, m.compile_cache_misses or 0
    cache = f" (inductor's cache: {hits} graph(s) loaded, {misses} built)" if hits or misses else ""
    return [
        ("compile", f"{m.compiled_graphs} graph(s) in {_fmt(m.compile_time_s, ' s')}, part of the training time{cache}")
    ]


def _startup_rows(m: RunMetrics) -> list[tuple[str, str]]:
    """How long the run took to start and where it went; none for a metrics.json from before it was measured."""
    if m.startup_s is None:
        return []
    parts = [
        f"{name} {_fmt(value, ' s')}"
        for name, value in (
            ("launch", m.startup_launch_s),
            ("process", m.startup_process_s),
            ("build", m.startup_build_s),
        )
        if value is not None
    ]
    return [("start-up", f"{_fmt(m.startup_s, ' s')} until the run was built ({', '.join(parts)})")]


def _training_rows(m: RunMetrics) -> list[tuple[str, str]]:
    rss = m.peak_host_rss_gb
    before = ""
    if m.initial_exact_match is not None:
        label = f"at step {m.initial_eval_step}, resumed" if m.initial_eval_step else "untrained"
        before = f"  ({label}: EM {_fmt(m.initial_exact_match)}, F1 {_fmt(m.initial_f1)})"
    saves = f" ({_fmt(m.checkpoint_runtime_s, ' s')} of it checkpoints)" if m.checkpoint_runtime_s else ""
    return [
        _strategy_row(m),
        ("exact match / F1", f"{_fmt(m.exact_match)} / {_fmt(m.f1)}{before}"),
        (
            "train steps",
            f"{_fmt(m.train_steps)} x global batch {_fmt(m.global_batch_size)} "
            f"({_fmt(m.num_train_features)} windows of {_fmt(m.max_seq_length)} max)",
        ),
        *(
            _measured_rows(m)
            if m.train_steps != 0
            else [("training", "no step (--max_train_steps 0): nothing to time")]
        ),
        ("peak host RSS", f"max {_fmt(rss.max, ' GiB')} per rank (lifetime)"),
        ("runtime", f"{_fmt(m.train_runtime_s, ' s')} training{saves}, {_fmt(m.total_runtime_s, ' s')} total"),
        *_startup_rows(m),
        *_compile_rows(m),
        ("output", _fmt(m.output_dir)),
    ]


def _measured_rows(m: RunMetrics) -> list[tuple[str, str]]:
    """What the training steps measured: throughput, step time, memory while training."""
    mem = m.peak_memory_gb
    return [
        (
            "throughput",
            f"{_fmt(m.train_samples_per_second)} samples/s, "
            f"{_fmt(m.train_tokens_per_second)} tokens/s "
            f"({_fmt(m.train_padded_tokens_per_second)} padded)",
        ),
        # Steps of a small model on a GPU take milliseconds: two decimals of a second would read 0.00.
        ("step time", f"{_fmt(m.train_step_time_s_mean, ' s', digits=4)}, MFU {_percent(m.mfu)}"),
        (
            "peak memory",
            f"max {_fmt(mem.max, ' GiB')} / mean {_fmt(mem.mean, ' GiB')} per rank [{_fmt(m.peak_memory_source)}]",
        ),
    ]


def forget_steps_after(step_log: Path, step: int) -> int:
    """A resumed run logs again the steps after its checkpoint: drop the interrupted run's lines for them.
    Returns the highest step the log held (0 without one): what the trackers were last sent, as the log is
    written before them."""
    if not step_log.exists():
        return 0
    lines = step_log.read_text().splitlines()
    logged = [(line, _logged_step(step_log, number, line)) for number, line in enumerate(lines, 1) if line.strip()]
    kept = [line for line, logged_step in logged if logged_step <= step]
    if len(kept) != len(lines):
        atomic_write_text(step_log, "".join(f"{line}\n" for line in kept))
    return max([int(s) for _, s in logged if math.isfinite(s)], default=0)


def read_step_log(step_log: Path) -> list[dict[str, Any]]:
    """The step log's records in logged order, for readers of a run that may still be writing or was killed
    mid-write: a torn last line is skipped with a warning; a bad line before it is refused with its number."""
    numbered = [(n, line) for n, line in enumerate(step_log.read_text().splitlines(), 1) if line.strip()]
    records = []
    for i, (number, line) in enumerate(numbered):
        try:
            records.append(_step_record(line))
        except ValueError as err:
            if i < len(numbered) - 1:
                raise ValueError(f"{step_log}: line {number} {err}") from None
            _warn_torn(step_log, number, "skipped")
    return records


def _logged_step(step_log: Path, number: int, line: str) -> float:
    """A line's step; infinity (dropped) for one that is not a JSON record, as a crash mid-write leaves the last.
    Any line, not only the last: a resume must not crash on its own log."""
    try:
        return _step_record(line).get("step", 0)
    except ValueError:
        _warn_torn(step_log, number, "dropped")
        return math.inf


def _step_record(line: str) -> dict[str, Any]:
    """One line of the step log; ValueError (its text finishes "line N ...") if it is not a JSON object."""
    try:
        record = json.loads(line)
    except ValueError as err:
        raise ValueError(f"is not JSON ({err})") from None
    if not isinstance(record, dict):
        raise ValueError(f"is not a JSON record: {line[:80]!r}")
    return record


def _warn_torn(step_log: Path, number: int, what: str) -> None:
    log.warning("%s: line %d is not a JSON record (torn by an interrupted write?): %s", step_log, number, what)
