"""qa_train.strategy.op_builds: a build lock left by a killed DeepSpeed op build no longer hangs every later run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qa_train.strategy import op_builds
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


def test_each_python_environment_builds_into_its_own_folder_and_a_users_folder_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two environments sharing torch's folder rebuild each other's ops (their build commands name their own
    paths); each gets a folder of its own under torch's default, where torch then builds DeepSpeed's ops."""
    from torch.utils.cpp_extension import _get_build_directory, get_default_build_root

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # torch's default folder, here under tmp_path
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv-a"))
    op_builds.use_environment_builds()
    first = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    assert first.parent == Path(get_default_build_root()) == tmp_path / "cache" / "torch_extensions"
    assert first.name.startswith("env-")
    assert Path(_get_build_directory("cpu_adam", verbose=False)).is_relative_to(first)
    assert op_builds.build_root() == first  # where stale locks are looked for
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv-b"))
    assert op_builds.environment_build_root() != first
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv-a"))
    assert op_builds.environment_build_root() == first, "the same environment keeps its folder"

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "mine"))
    op_builds.prepare()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "mine")


def test_the_environments_own_ninja_builds_where_it_has_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain `.venv/bin/python` finds the system's ninja on PATH, an activated venv pip's: each would rebuild the
    ops the other built. The environment's own comes first wherever it has one."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "builds"))
    bare, tools = tmp_path / "bare" / "bin", tmp_path / "venv" / "bin"
    for folder in (bare, tools):
        folder.mkdir(parents=True)
        (folder / "python").touch()
    (tools / "ninja").touch()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(sys, "executable", str(bare / "python"))
    op_builds.use_environment_builds()
    assert os.environ["PATH"] == "/usr/bin:/bin", "no ninja of its own: the system's, as before"
    monkeypatch.setattr(sys, "executable", str(tools / "python"))
    op_builds.use_environment_builds()
    op_builds.use_environment_builds()  # once is enough
    assert os.environ["PATH"] == f"{tools}:/usr/bin:/bin"
