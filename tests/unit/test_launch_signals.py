"""qa_train.strategy.supervise and agent without processes: the exit code a launch returns, which failed rank
is the root cause, which processes are ranks, and the agent every launch runs through."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import PY

from qa_train.strategy import supervise


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [(1, "75\n", 75), (0, "75\n", 0), (1, "0\n", 1), (1, None, 1), (137, None, 137), (1, "garbage", 1)],
)
def test_main_process_code(tmp_path: Path, code: int, status: str | None, expected: int) -> None:
    path = tmp_path / "status"
    if status is not None:
        path.write_text(status)
    assert supervise._main_process_code(code, path) == expected


def test_a_killed_launchers_status_file_is_removed_by_the_next_launch_and_no_other(tmp_path: Path) -> None:
    """A launcher killed by SIGKILL leaves its status file (its ranks may still write their code into it); the next
    launch removes the files of launchers that no longer run, and nothing else in the temp folder."""
    import os

    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have it
    orphan = tmp_path / f"{supervise.STATUS_PREFIX}{gone}-k2j4x8"
    live = tmp_path / f"{supervise.STATUS_PREFIX}{os.getpid()}-a1b2c3"
    older = tmp_path / f"{supervise.STATUS_PREFIX}q9w8e7r6"  # before files carried a pid: whose, unknown
    others = [tmp_path / f"{supervise.STATUS_PREFIX}x-{gone}", tmp_path / "notes.txt"]
    for path in (orphan, live, older, *others):
        path.write_text("75\n")
    assert supervise.remove_orphaned_status_files(tmp_path) == [orphan]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (live, older, *others))


def test_a_rank_that_only_saw_its_peer_leave_is_not_the_root_cause_in_the_same_second() -> None:
    """torch's failure timestamps are whole seconds and its tie goes to the lower rank: rank 0, which only lost its
    peer (exit 1), would be named over rank 1, which ran out of memory (exit 7) in the same second."""
    from types import SimpleNamespace

    from qa_train.strategy.agent import root_cause

    same = {0: SimpleNamespace(timestamp=100, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=7)}
    assert root_cause(same)[0] == 1
    earlier = {0: SimpleNamespace(timestamp=99, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=7)}
    assert root_cause(earlier)[0] == 0  # an earlier failure stays the first
    killed = {0: SimpleNamespace(timestamp=100, exitcode=1), 1: SimpleNamespace(timestamp=100, exitcode=-9)}
    assert root_cause(killed)[0] == 1


TORCHRUN_ARGS = ["--nproc_per_node", "2", "-m", "qa_train", "--tee", "3"]  # the last two are qa_train's, not torchrun's
ACCELERATE_ARGS = ["--config_file", "ddp.yaml", "--num_processes", "2", "-m", "qa_train", "--log_dir", "x"]


@pytest.fixture
def no_log_variables(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No torchrun PET_* variable that asks for log files (the suite's base_env sets PET_LOG_DIR for its launches)."""
    for name in ("PET_LOG_DIR", "PET_TEE", "PET_REDIRECTS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(("which", "args"), [("torchrun", TORCHRUN_ARGS), ("accelerate", ACCELERATE_ARGS)])
@pytest.mark.usefixtures("no_log_variables")
def test_a_launch_that_asks_for_no_log_files_gets_no_log_folder(which: str, args: list[str]) -> None:
    """torchrun made a /tmp/torchelastic_* folder per launch and never removed it: the test suite alone left
    hundreds. The agent names /dev/null, and each launcher hands it to torchrun's log specs as it reads flags."""
    import os

    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils.launch import _filter_args
    from torch.distributed.run import get_args_parser

    from qa_train.strategy.agent import without_log_folder

    given = without_log_folder(which, args)
    assert given == ["--log_dir", os.devnull, *args]
    if which == "torchrun":
        assert get_args_parser().parse_args(given).log_dir == os.devnull
    else:  # accelerate's multi-GPU launcher passes its namespace to torchrun through _filter_args
        parsed = launch_command_parser().parse_args(given)
        assert _filter_args(parsed, get_args_parser(), ["x.py"]).log_dir == os.devnull


@pytest.mark.parametrize(
    ("which", "asked", "env"),
    [
        ("torchrun", ["--log-dir", "/var/log/elastic"], {}),
        ("torchrun", ["--tee=3"], {}),
        ("torchrun", ["-r", "3"], {}),
        ("torchrun", ["--redir", "3"], {}),  # argparse's abbreviation of --redirects, as torchrun reads it
        ("torchrun", [], {"PET_LOG_DIR": "/var/log/elastic"}),
        ("torchrun", [], {"PET_TEE": "3"}),
        ("accelerate", ["--log_dir", "/var/log/elastic"], {}),
        ("accelerate", ["-t", "3"], {}),
    ],
)
def test_a_launch_that_asks_for_log_files_keeps_torchruns_folder(
    which: str, asked: list[str], env: dict[str, str], no_log_variables: pytest.MonkeyPatch
) -> None:
    from qa_train.strategy.agent import without_log_folder

    for name, value in env.items():
        no_log_variables.setenv(name, value)
    args = [*asked, *(TORCHRUN_ARGS if which == "torchrun" else ACCELERATE_ARGS)]
    assert without_log_folder(which, args) == args


def test_loader_workers_forked_by_a_rank_are_not_ranks() -> None:
    """A DataLoader worker is forked by its rank and carries the rank's `-m qa_train`: the launcher counted
    "asked 6 rank(s)" for two ranks with two workers each."""

    class Proc(NamedTuple):
        pid: int
        parent: int

        def ppid(self) -> int:
            return self.parent

    rank0, rank1 = Proc(10, 1), Proc(11, 1)
    workers = [Proc(20, 10), Proc(21, 10), Proc(22, 11)]
    assert supervise.outermost([workers[0], rank0, *workers[1:], rank1]) == [rank0, rank1]


def test_the_launch_runs_through_the_agent_that_reports_a_failed_rank() -> None:
    agent = [PY, "-m", "qa_train.strategy.agent"]
    assert supervise.agent_command(["accelerate", "launch", "--config_file", "c.yaml", "-m", "qa_train"]) == [
        *agent,
        "accelerate",
        "--config_file",
        "c.yaml",
        "-m",
        "qa_train",
    ]
    assert supervise.agent_command([PY, "-m", "accelerate.commands.launch", "--num_processes", "2"]) == [
        *agent,
        "accelerate",
        "--num_processes",
        "2",
    ]
    assert supervise.agent_command([PY, "-m", "torch.distributed.run", "--nnodes", "2", "-m", "qa_train"]) == [
        *agent,
        "torchrun",
        "--nnodes",
        "2",
        "-m",
        "qa_train",
    ]
    # The YAML that torchrun never reads goes to the agent, which refuses it as accelerate would, then says the
    # command it runs.
    torchrun = [PY, "-m", "torch.distributed.run", "-m", "qa_train"]
    assert supervise.agent_command(torchrun, "ddp.yaml", echo=True) == [
        *agent,
        "torchrun",
        "--accelerate_config",
        "ddp.yaml",
        "--echo",
        " ".join(torchrun),
        "-m",
        "qa_train",
    ]
    assert supervise.agent_command([PY, "-m", "qa_train", "--do_eval"]) == [PY, "-m", "qa_train", "--do_eval"]
