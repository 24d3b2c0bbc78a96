"""qa_train/core/teardown.py: once a run has returned its code, the process ends with it after the exit handlers,
without the interpreter's teardown (where a gloo worker freeing Python tensors aborts the rank); a process that
raised tears down as usual; `python -m qa_train` is armed from its first line."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from conftest import PY

# A module global whose finalizer runs only in the interpreter's teardown, exit handlers registered after `arm` (as
# every library's is), and output left in the buffers (Python's, then C's) of a redirected stdout.
SCRIPT = """
import atexit, ctypes, sys
from pathlib import Path
from qa_train.core import teardown

out = Path(sys.argv[1])
teardown.arm()
atexit.register(lambda: (out / "exit-handler").write_text("ran"))
atexit.register(lambda: ctypes.CDLL(None).printf(b"C's buffered line\\n"))


class Finalized:
    def __del__(self) -> None:
        (out / "teardown").write_text("ran")


kept = Finalized()
print("buffered line")
if sys.argv[2] == "raise":
    raise RuntimeError("the run crashed")
sys.exit(teardown.leave(int(sys.argv[2])))
"""

# For `python -m qa_train`: a C exit handler, as C++'s static destructors are, run by exit() after the interpreter's
# teardown. It aborts the process, as a gloo worker thread that meets the finalizing interpreter does.
SITE_HOOK = """
import ctypes

libc = ctypes.CDLL(None)
libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)
"""


def run(tmp_path: Path, outcome: str) -> tuple[subprocess.CompletedProcess[str], str]:
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # which unbuffers C's stdout too
    with (tmp_path / "stdout").open("w") as stdout:
        cmd = [PY, str(script), str(tmp_path), outcome]
        done = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env)
    return done, (tmp_path / "stdout").read_text()


def test_a_returned_code_ends_the_process_after_the_exit_handlers_and_before_the_teardown(tmp_path: Path) -> None:
    done, stdout = run(tmp_path, "75")
    assert done.returncode == 75
    assert stdout == "buffered line\nC's buffered line\n"
    assert (tmp_path / "exit-handler").read_text() == "ran"
    assert not (tmp_path / "teardown").exists()


def test_a_process_that_raised_tears_down_as_usual(tmp_path: Path) -> None:
    done, stdout = run(tmp_path, "raise")
    assert done.returncode == 1
    assert "RuntimeError: the run crashed" in done.stderr
    assert stdout == "buffered line\nC's buffered line\n"
    assert (tmp_path / "exit-handler").read_text() == "ran"
    assert (tmp_path / "teardown").read_text() == "ran"


def test_python_m_qa_train_ends_before_a_teardown_that_would_abort(tmp_path: Path) -> None:
    """The refusal of a missing --train_file returns its code before any library is imported: the cheapest whole
    `python -m qa_train`, and `qa-train train` (qa_train.cli, which arms the exit for it). The same hook under a
    process without qa_train's exit shows the abort it escapes."""
    (tmp_path / "sitecustomize.py").write_text(SITE_HOOK)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    flags = ["--train_file", str(tmp_path / "missing.json"), "--output_dir", str(tmp_path / "out")]
    for command in (["qa_train"], ["qa_train.cli", "train"]):
        done = subprocess.run([PY, "-m", *command, *flags], env=env, capture_output=True, text=True)
        assert done.returncode == 2, (command, done.stderr)
        assert "missing.json' does not exist" in done.stderr

    done = subprocess.run([PY, "-c", "pass"], env=env, capture_output=True, text=True)
    assert done.returncode == -signal.SIGABRT
