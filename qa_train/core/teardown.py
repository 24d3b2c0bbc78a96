"""A rank's process ends without the interpreter's teardown once its run has returned an exit code.

Why: a process group can outlive `destroy_process_group` (DeepSpeed's engine keeps it through the hooks it leaves on
the autograd graph, and a DDP module of torch 2.13 once built keeps it too), so gloo's worker threads are still
alive when the interpreter finalizes. A worker that frees its last collective's tensors after that point asks for
the GIL for their Python objects; Python ends the thread with pthread_exit, and the unwinding through torch's
noexcept destructor calls std::terminate. The rank then aborts ("terminate called without an active exception",
SIGABRT) after a finished run, and the launch reports the run as failed. torch does not join these threads (its
destroy_process_group says as much), so qa_train does not let its ranks reach the teardown at all.

`arm` registers the exit handler first, so that it runs last: the interpreter still joins its non-daemon threads and
runs every other exit handler (logging's, multiprocessing's children, inductor's compile workers, the trackers'),
then the handler flushes the standard streams (Python's and C's) and ends the process with the run's code. A process
that raised instead of returning a code tears down as usual, with its traceback.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys

_armed = False
_code: int | None = None


def arm() -> None:
    """First thing in the process: the exit handlers registered before this one (torch's own registers six at its
    import) would run after it, that is never."""
    global _armed
    if not _armed:
        atexit.register(_end_process)
        _armed = True


def leave(code: int) -> int:
    """The run ended with `code`: the process ends with it once the exit handlers have run. Returns `code`."""
    global _code
    _code = code
    return code


def _end_process() -> None:
    if _code is None:
        return
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # closed, or a pipe nobody reads any more
            pass
    try:  # C's buffered output too (the libraries' printf, std::cout), which exit() would have flushed
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
    os._exit(_code)
