"""`python -m qa_train [flags]`, also under `accelerate launch ... -m qa_train`.

Exit codes: qa_train.core.errors.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from qa_train.core.errors import (
    CRASHED,
    DIVERGED,
    ERROR_PREFIX,
    EXPORT_FAILED,
    FINISHED,
    HUNG,
    OUT_OF_MEMORY,
    PREEMPTED,
    REFUSED,
    SAVE_FAILED,
    STATUS_FILE_ENV,
)

if TYPE_CHECKING:
    from qa_train.config.settings import TrainArgs
    from qa_train.data.splits import Splits


def _rank() -> int:
    """The launcher's rank, known before any process group exists (torchrun, accelerate and DeepSpeed set RANK)."""
    return int(os.environ.get("RANK", "0"))


def _say(message: str, rank: int, speaker: int = 0) -> None:
    if rank == speaker:  # every rank meets the same error; one line is enough
        print(f"{ERROR_PREFIX}{message}", file=sys.stderr, flush=True)


def _out_of_space(err: OSError, output_dir: str) -> str:
    from qa_train.strategy.checkpoint import complete_checkpoints

    where = f" writing {err.filename}" if err.filename else ""
    # The rerun that claim() accepts: resuming needs a checkpoint to be worth it, overwriting does not.
    rerun = (
        "--resume_from_checkpoint latest (the checkpoints saved are complete)"
        if complete_checkpoints(output_dir)
        else "--overwrite_output_dir (no checkpoint was saved)"
    )
    return f"{err.strerror}{where}; free space, then rerun with {rerun}"


def _noted(message: str, err: BaseException) -> str:
    """A line with the notes the run added to the error on its way out (where the trained weights are)."""
    return "; ".join([message, *getattr(err, "__notes__", ())])


def _compile_failed(cause: BaseException, backend: str | None) -> str:
    """torch.compile's failure (a backend's package missing, no C++ compiler for inductor on CPU) in one line;
    its own message spans lines and points at TORCHDYNAMO_VERBOSE."""
    from qa_train.core.errors import one_line

    flag = f"--torch_compile_backend {backend}" if backend else "--torch_compile (backend inductor)"
    return f"{flag}: compiling the model failed ({one_line(cause)}); choose another backend or drop it"


def _hung(err: BaseException, rank: int, timeout_s: float) -> str:
    # Nothing here reads the output dir: a file system that stopped answering may be why a rank hung.
    return (
        f"rank {rank}: a collective{_where(err)} waited more than {timeout_s:g} s for the other ranks "
        "(--ddp_timeout): one of them hung or died; rerun with --resume_from_checkpoint latest, or raise "
        "--ddp_timeout if one rank works alone that long"
    )


def _where(err: BaseException) -> str:
    """The innermost frame of qa_train's own that the error passed through: which wait it was (a step's log, a
    checkpoint, featurisation on the first process) tells a hung rank from a long wait."""
    import traceback
    from pathlib import Path

    package = Path(__file__).parent
    ours = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename).is_relative_to(package)]
    if not ours:
        return ""
    frame = ours[-1]
    return f" (in qa_train/{Path(frame.filename).relative_to(package)}:{frame.lineno}, {frame.name})"


def main(argv: list[str] | None = None) -> int:
    from qa_train.config.flags import parse_args
    from qa_train.config.outputdir import claim
    from qa_train.config.settings import ConfigError
    from qa_train.strategy.checks import check_inductor_cache, check_launch_env

    try:
        check_launch_env(os.environ)
    except ConfigError as err:  # said by every process: its RANK is what is in doubt
        print(f"{ERROR_PREFIX}{err}", file=sys.stderr, flush=True)
        return REFUSED
    rank = _rank()
    try:
        args = parse_args(argv)
        check_inductor_cache(os.environ)
        # The run's first process holds the output dir for the run's life: a second run there is refused at once.
        lock = claim(args.output, lock=rank == 0, sources=args.sources())
    except ConfigError as err:
        _say(str(err), rank)
        return REFUSED
    try:
        splits = _read_data(args, rank)
        return REFUSED if splits is None else _train(args, rank, splits)
    finally:
        if lock is not None:
            lock.release()


def _read_data(args: TrainArgs, rank: int) -> Splits | None:
    """Every record read and checked before torch, transformers and accelerate are imported (seconds): a bad file
    is refused at once. None once refused."""
    from qa_train.config.settings import ConfigError
    from qa_train.data.load import DataError
    from qa_train.data.splits import load_splits

    try:
        return load_splits(args)
    except (ConfigError, DataError) as err:
        _say(str(err), rank)
        return None


def _train(args: TrainArgs, rank: int, splits: Splits) -> int:
    """Run, and turn each way a run can end into its exit code and one line."""
    from torch._dynamo.exc import BackendCompilerFailed

    from qa_train.config.settings import ConfigError
    from qa_train.data.load import DataError
    from qa_train.outcome import ExportError
    from qa_train.run import Preempted, run
    from qa_train.strategy.checkpoint import CheckpointError
    from qa_train.strategy.checks import LaunchError
    from qa_train.strategy.faults import collective_fault
    from qa_train.strategy.oom import OutOfMemory, elsewhere, is_out_of_memory, plan_command
    from qa_train.strategy.saving import OUT_OF_SPACE, CheckpointSaveError
    from qa_train.trainer import TrainingDiverged

    try:
        run(args, splits)
    except (LaunchError, ConfigError, DataError) as err:
        _say(str(err), rank)
        return REFUSED
    except BackendCompilerFailed as err:  # at the first step, on every rank alike; nothing is trained or written
        _say(_compile_failed(err.inner_exception, args.system.torch_compile_backend), rank)
        return REFUSED
    except CheckpointError as err:  # raised on every rank; where only some failed, the lowest of them says why
        _say(str(err), rank, speaker=err.reporter)
        return REFUSED
    except TrainingDiverged as err:
        _say(str(err), rank)
        return DIVERGED
    except ExportError as err:
        _say(str(err), rank)
        return EXPORT_FAILED
    except CheckpointSaveError as err:  # raised on every rank; only the rank that failed knows why
        _say(str(err), rank, speaker=err.reporter)
        return SAVE_FAILED
    except OSError as err:  # not collective: the rank that met it says so
        if err.errno not in OUT_OF_SPACE:
            raise  # any other OSError is a crash, with its traceback
        _say(_noted(_out_of_space(err, args.output.output_dir), err), rank, speaker=rank)
        return SAVE_FAILED
    except Preempted:  # its checkpoint and the log line saying so are written
        return PREEMPTED
    except OutOfMemory as err:  # not collective: the rank that met it says where and what to change
        _say(_noted(f"rank {rank}: {err}", err), rank, speaker=rank)
        return OUT_OF_MEMORY
    except (RuntimeError, MemoryError) as err:  # not collective either: the ranks that met it say so
        if is_out_of_memory(err):  # outside a step or an evaluation batch: building, placing or loading the model
            _say(_noted(f"rank {rank}: {elsewhere(err, _where(err), plan_command(args))}", err), rank, speaker=rank)
            return OUT_OF_MEMORY
        fault = collective_fault(err)
        if fault is None:
            raise
        if fault == "timeout":
            _say(_noted(_hung(err, rank, args.system.ddp_timeout), err), rank, speaker=rank)
            return HUNG
        # Another rank failed first and says why; this one's traceback would bury that line.
        _say(
            f"rank {rank}: another rank left the run during a collective{_where(err)} (its own lines say why)",
            rank,
            speaker=rank,
        )
        return CRASHED
    return FINISHED


def _report_status(code: int) -> int:
    path = os.environ.get(STATUS_FILE_ENV)
    # CRASHED here is a rank left by another: the launcher keeps the code of the rank torch names as the root cause.
    if path and _rank() == 0 and code != CRASHED:
        try:
            with open(path, "w") as f:
                f.write(f"{code}\n")
        except OSError:
            pass  # the launcher then reports its own code
    return code


def entry(argv: list[str] | None = None) -> int:
    """A rank's whole life: `python -m qa_train` (what launchers run) and `qa-train train`, each of which then ends
    the process without the interpreter's teardown (core/teardown.py). Another program calls main() instead."""
    from qa_train.core import collector, logs
    from qa_train.core.preemption import catch_early_stop_signals
    from qa_train.observe import startup

    startup.entered()  # this process's start is the run's: metrics.json's startup_process_s
    collector.pause()  # until the run is built (qa_train/core/collector.py)
    catch_early_stop_signals()  # before the seconds of imports and loading that precede the trainer's own handler
    logs.from_the_start()  # the output dir's lock warns before the trainer sets up logging
    return _report_status(main(argv))


if __name__ == "__main__":
    from qa_train.core import teardown

    teardown.arm()  # before any library registers an exit handler of its own, as qa_train.cli does for `train`
    sys.exit(teardown.leave(entry()))
