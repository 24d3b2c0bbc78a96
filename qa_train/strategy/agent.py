"""The launch agent of one machine (torchrun, or accelerate launch, which runs torchrun), as qa_train.strategy.launch runs it.

    python -m qa_train.strategy.agent torchrun|accelerate ARGS...    (what `torchrun ARGS` or `accelerate launch ARGS` do)
    python -m qa_train.strategy.agent torchrun --accelerate_config YAML [--echo CMD] ARGS...

Before anything starts, the accelerate config is refused in one line (exit 2) where accelerate would refuse or
ignore it: the one `accelerate launch` is given, or the YAML that `qa-train launch` turned into a torchrun
command (torchrun never reads it, so a misspelled DEEPSPEED would run DDP). `--echo CMD` prints `+ CMD` once it
passed: the command `qa-train launch` runs through this agent.

Both end a launch in which a rank failed by raising torch's ChildFailedError uncaught (accelerate's launcher of a
single process, CalledProcessError): a 35-line traceback of the agent's own frames under the rank's one-line
error, and exit code 1 whatever the ranks' own codes said, so a machine other than rank 0's reported 1 where its
ranks were preempted (75). Here the failure is one line, and the
exit code is that of the rank torch names as the root cause (the first seen failed; with no error files, seen
at a poll of whole seconds), 128 + N for a rank killed by signal N. An agent stopped by a signal itself (the
launcher's stop before any rank exists) says so in one line and exits 128 + N, where torchrun raised a traceback.

A launch that names no log folder, tee or redirect gets `--log_dir /dev/null`: torchrun's default is a new
/tmp/torchelastic_* folder per launch that nobody removes (see `without_log_folder`); `--echo` shows the command
without it, as a user would type it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

from qa_train.core import collector

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

# Signals after which a rank had no chance to say why: where they usually come from.
KILLED_BY = {
    signal.SIGKILL: "it could say nothing: the kernel's out-of-memory killer sends SIGKILL when host memory runs "
    "out (dmesg says so), as do kill -9 and a scheduler's hard limits",
    signal.SIGABRT: "often NCCL's watchdog, which aborts a rank whose collective waited past --ddp_timeout; its "
    "lines above say so if it was",
}


def rank_exit_code(code: int) -> int:
    return code if code >= 0 else 128 - code


def root_cause(failures: dict[int, ProcessFailure]) -> tuple[int, ProcessFailure]:
    """The first rank to fail, as torch's get_first_failure, but its timestamps are whole seconds: a rank that only
    saw its peer leave (exit 1, one line) can fail in the same second as the rank that ran out of memory or
    timed out, and a tie goes to the lower rank. Among the first, a code other than 1 says more."""
    rank = min(failures, key=lambda r: (failures[r].timestamp, failures[r].exitcode == 1))
    return rank, failures[rank]


def summary(error) -> tuple[str, int]:
    """One line for a ChildFailedError, and the exit code of the failure torch names as the root cause."""
    rank, first = root_cause(error.failures)
    code = rank_exit_code(first.exitcode)
    why = "its own lines above say why"
    if first.exitcode < 0:
        try:
            sig = signal.Signals(-first.exitcode)
            what = f"was killed by {sig.name}"
            why = KILLED_BY.get(sig, why)
        except ValueError:
            what = f"was killed by signal {-first.exitcode}"
    else:
        what = f"exited with {code}"
    others = len(error.failures) - 1
    also = f"; {others} other rank(s) of this machine failed after it" if others else ""
    return f"rank {rank} {what} ({why}){also}", code


def config_file(args: list[str]) -> str | None:
    """The accelerate config that `accelerate launch ARGS` would read."""
    found = [a.split("=", 1)[1] for a in args if a.startswith("--config_file=")]
    found += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config_file"]
    return found[0] if found else None


def _config_refusal(path: str | None) -> str | None:
    """Why the accelerate config at `path` cannot run, or None."""
    from qa_train.strategy.launch import LaunchConfigError, read_config

    try:
        if path is not None:
            read_config(path)
    except LaunchConfigError as err:
        return str(err)
    return None


def without_log_folder(which: str, args: list[str]) -> list[str]:
    """`args` with `--log_dir /dev/null` first where the launch asks for no log files of its own (no log folder, tee
    or redirect, in flags or, for torchrun, PET_* variables); otherwise `args` as they are."""
    # torchrun's default log folder is a new mkdtemp per launch, never removed. Without tee or redirect it holds
    # only empty rank folders and @record's error files, which qa_train's ranks never write, so /dev/null (torch's
    # "no log files") loses nothing. The launchers' own parsers read the flags as the launch will.
    if which == "torchrun":
        from torch.distributed.run import get_args_parser

        parsed = get_args_parser().parse_args(args)
    else:
        from accelerate.commands.launch import launch_command_parser

        parsed = launch_command_parser().parse_args(args)
    asked = parsed.log_dir is not None or parsed.tee != "0" or getattr(parsed, "redirects", "0") != "0"
    return args if asked else ["--log_dir", os.devnull, *args]


def _said_by_the_agent(record: logging.LogRecord) -> bool:
    """torch's own `failed (exitcode: N) local_rank: R ...` line is dropped: the agent's one line says the same,
    with its own choice of the first failure among ranks that failed in the same second."""
    return not str(record.msg).startswith("failed (exitcode")


def _start(which: str, args: list[str]) -> None:
    """torchrun or accelerate launch, in this process, to their end."""
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_said_by_the_agent)
    if which == "torchrun":
        from torch.distributed.run import main as torchrun

        collector.settle()
        torchrun(args)
    else:
        from accelerate.commands.launch import main as accelerate_launch

        sys.argv = ["accelerate launch", *args]  # accelerate's launcher parses sys.argv itself
        collector.settle()
        accelerate_launch()


def main(argv: list[str]) -> int:
    import subprocess

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    which, args = argv[0], argv[1:]
    if which not in ("torchrun", "accelerate"):
        print(f"qa_train.strategy.agent: unknown agent {which!r}: torchrun or accelerate", file=sys.stderr)
        return 2
    config: str | None = config_file(args) if which == "accelerate" else None
    echo = None
    if which == "torchrun" and args[:1] == ["--accelerate_config"]:
        config, args = args[1], args[2:]
    if args[:1] == ["--echo"]:
        echo, args = args[1], args[2:]
    refusal = _config_refusal(config)
    if refusal is not None:  # accelerate would refuse less, and in a traceback (slurm/train.sbatch's path)
        print(f"qa-train launch: error: {refusal}", file=sys.stderr, flush=True)
        return 2
    if echo is not None:
        print(f"+ {echo}", file=sys.stderr, flush=True)
    try:
        _start(which, without_log_folder(which, args))
    except ChildFailedError as err:
        line, code = summary(err)
    except SignalException as err:  # torchrun's own SIGTERM/SIGINT handler, once it has stopped its ranks
        code = 128 + int(err.sigval)
        line = f"the launch was stopped by {err.sigval.name}"
    except subprocess.CalledProcessError as err:  # accelerate's launcher of one process without a process group
        code = rank_exit_code(err.returncode)
        line = f"the run exited with {code} (its own lines above say why)"
    else:
        return 0
    print(f"qa-train launch: {line}", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    collector.pause()  # until the launcher is imported: what it imports lives as long as this process
    sys.exit(main(sys.argv[1:]))
