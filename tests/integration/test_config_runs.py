"""`python -m qa_train` refuses bad flags itself, fast, before torch or data are touched."""

from __future__ import annotations

import time

from conftest import PY, run_cmd


def test_cli_refuses_fast_without_loading(env: dict[str, str]) -> None:
    """The refusal comes from the entry point itself, before torch or data are touched."""
    t0 = time.perf_counter()
    proc = run_cmd([PY, "-m", "qa_train", "--doc_stride", "512"], env)
    assert proc.returncode == 2
    assert "--doc_stride" in proc.stderr and "--max_seq_length" in proc.stderr
    assert time.perf_counter() - t0 < 20
    assert "Traceback" not in proc.stderr
