"""qa_train.strategy.op_builds: a build lock left by a killed DeepSpeed op build no longer hangs every later run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qa_train.strategy.op_builds import ask_cpu_once, build_locks, clear_stale_locks, held_here


def _lock(root: Path, op: str, age_s: float) -> Path:
    lock = root / "py311_cpu" / op / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_an_old_lock_nobody_holds_is_removed_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = _lock(tmp_path, "deepspeed_shm_comm", age_s=3600)
    (old.parent / "deepspeed_shm_comm.so").write_bytes(b"built")
    assert clear_stale_locks(tmp_path) == [old]
    assert not old.exists() and (old.parent / "deepspeed_shm_comm.so").exists()
    assert any(str(old) in r.getMessage() and "killed build" in r.getMessage() for r in caplog.records)


def test_a_lock_a_live_process_holds_open_is_kept_however_old(tmp_path: Path) -> None:
    lock = _lock(tmp_path, "cpu_adam", age_s=3600)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, time; fd = os.open({str(lock)!r}, os.O_RDONLY); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"1"
        assert held_here(lock)
        assert clear_stale_locks(tmp_path) == [] and lock.exists()
    finally:
        holder.kill()
        holder.wait()
    assert not held_here(lock)


def test_a_young_unheld_lock_is_waited_for_until_released(tmp_path: Path) -> None:
    lock = _lock(tmp_path, "cpu_adam", age_s=1)
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # another node's build finishing while we wait
        slept.append(seconds)
        if len(slept) == 3:
            lock.unlink()

    assert clear_stale_locks(tmp_path, stale_after_s=600, sleep=sleep) == []
    assert len(slept) == 3 and all(0 < s <= 5 for s in slept)


def test_a_young_unheld_lock_that_is_never_released_is_removed_once_stale(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lock = _lock(tmp_path, "cpu_adam", age_s=0)
    now = [time.time()]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    assert clear_stale_locks(tmp_path, stale_after_s=30, clock=lambda: now[0], sleep=sleep) == [lock]
    assert not lock.exists()
    waiting = [r.getMessage() for r in caplog.records if "waiting for the build lock" in r.getMessage()]
    assert len(waiting) == 1 and str(lock) in waiting[0]


def test_locks_are_found_with_and_without_torchs_flavour_folder(tmp_path: Path) -> None:
    flavoured = _lock(tmp_path, "cpu_adam", age_s=0)
    plain = tmp_path / "deepspeed_shm_comm" / "lock"
    plain.parent.mkdir()
    plain.touch()
    assert set(build_locks(tmp_path)) == {flavoured, plain}


def test_deepspeeds_cpu_probes_reach_py_cpuinfo_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed's CPU builders ask py-cpuinfo for -march and the SIMD width on every op load, each answer a new
    subprocess of about a second; after ask_cpu_once the process asks once and every later call gets that answer."""
    import cpuinfo
    from deepspeed.ops.op_builder.cpu import CPUAdamBuilder

    asked: list[int] = []

    def probe() -> dict[str, str]:
        asked.append(1)
        return {"arch": "X86_64", "flags": "avx2"}

    monkeypatch.setattr(cpuinfo, "get_cpu_info", probe)
    ask_cpu_once()
    ask_cpu_once()  # a second call keeps the one cache
    builder = CPUAdamBuilder()
    flags = [builder.cpu_arch(), builder.simd_width(), builder.cpu_arch(), builder.simd_width()]
    assert flags == ["-march=native", "-D__AVX256__"] * 2
    assert len(asked) == 1
