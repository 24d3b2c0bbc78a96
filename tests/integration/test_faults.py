"""Faults end to end through `python -m qa_train`'s main: what a user sees, the exit code, and what is left on disk.
A run is a subprocess where the process is part of the fault (a file-size limit, a umask, a stop request), and main()
in the test process elsewhere.

Exit codes: 0 finished, 2 refused input, 3 diverged, 4 export failed, 5 a checkpoint save failed (its faults are
in test_disk_full.py), 75 preempted (see qa_train/__main__.py).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
import zlib
from pathlib import Path

import pytest
import torch
from conftest import (
    DEMO_DEV,
    PY,
    ROOT,
    TINY,
    base_env,
    error_lines,
    main_here,
    read_metrics,
    run_cmd,
    run_ok,
    tiny_flags,
)
from safetensors.torch import load_file


def flags(out: Path, *extra: str) -> list[str]:
    return tiny_flags(out, "--no_eval", *extra)


def qa_train(out: Path, *extra: str) -> list[str]:
    return [PY, "-m", "qa_train", *flags(out, *extra)]


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """main() in this process, for input refused in preflight, before any process group or accelerator exists:
    exit 2 and the one line it says."""
    code, _, err = main_here(argv, capsys)
    assert code == 2, err[-3000:]
    [line] = error_lines(err)
    return line


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished 3-step run with a checkpoint at every step, copied by each test that needs an old run."""
    out = tmp_path_factory.mktemp("finished") / "out"
    run_ok(
        qa_train(out, "--max_train_steps", "3", "--checkpointing_steps", "1", "--logging_steps", "1"),
        base_env(out.parent),
    )
    return out


def old_run(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    return out


def steps_in(out: Path) -> list[int]:
    """The training steps logged (evaluations log their eval/* lines at a step too)."""
    lines = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return [line["step"] for line in lines if "train/loss" in line]


@pytest.mark.usefixtures("in_process", "own_logging")
def test_divergence_stops_the_run_and_saves_nothing_non_finite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code, _, said = main_here(
        flags(
            out,
            "--max_train_steps",
            "10",
            "--logging_steps",
            "5",
            "--learning_rate",
            "1e6",
            "--checkpointing_steps",
            "1",
        ),
        capsys,
    )
    assert code == 3, said[-3000:]
    [line] = error_lines(said)
    assert "training diverged at step" in line and "--learning_rate" in line
    assert not (out / "final").exists() and not (out / "metrics.json").exists()
    for ckpt in (out / "checkpoints").glob("step_*"):
        for name, tensor in load_file(ckpt / "model.safetensors").items():
            assert torch.isfinite(tensor).all(), f"{ckpt.name}/{name} is not finite"


@pytest.mark.usefixtures("own_logging")
def test_occupied_output_dir_is_refused_and_overwrite_replaces_the_run(
    finished: Path, tmp_path: Path, in_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = old_run(finished, tmp_path)
    before = (out / "metrics.json").read_bytes()
    steps = ["step_00000001", "step_00000002", "step_00000003"]
    line = refused(flags(out, "--max_train_steps", "1"), capsys)
    assert str(out) in line and "--overwrite_output_dir" in line and "--resume_from_checkpoint latest" in line
    assert (out / "metrics.json").read_bytes() == before
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == steps

    # --overwrite_output_dir with a record that is refused: the refusal comes before the old run is touched.
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "data": [
                    {
                        "title": "t",
                        "paragraphs": [
                            {
                                "context": "a short context",
                                "qas": [
                                    {
                                        "id": "q1",
                                        "question": "what?",
                                        "answers": [{"text": "absent", "answer_start": 0}],
                                    }
                                ],
                            }
                        ],
                    }
                ]
            }
        )
    )
    line = refused(flags(out, "--max_train_steps", "1", "--train_file", str(bad), "--overwrite_output_dir"), capsys)
    assert str(bad) in line and "q1" in line
    assert (out / "metrics.json").read_bytes() == before
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == steps

    code, _, said = main_here(
        flags(
            out,
            "--max_train_steps",
            "1",
            "--checkpointing_steps",
            "1",
            "--save_total_limit",
            "1",
            "--overwrite_output_dir",
        ),
        capsys,
    )
    assert code == 0, said[-3000:]
    # The old run's later steps are gone with it: they can neither become `latest` nor push the new run's out.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000001"]
    assert json.loads((out / "metrics.json").read_text())["train_steps"] == 1


@pytest.mark.parametrize("where", ["under_a_file", "sysfs"])
def test_unwritable_output_dir_is_refused_before_any_work(where: str, tmp_path: Path, env: dict[str, str]) -> None:
    if where == "under_a_file":
        (tmp_path / "a_file").write_text("x")
        out = tmp_path / "a_file" / "out"
    else:
        out = Path("/sys/qa_train_test_out")  # not writable even for root
    proc = run_cmd(qa_train(out, "--max_train_steps", "1"), env)
    assert proc.returncode == 2
    [line] = error_lines(proc.stderr)
    assert f"--output_dir {out}: not writable" in line
    assert not (tmp_path / "cache").exists(), "featurisation ran before the refusal"


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is refused only without CUDA")
def test_fp16_on_cpu_is_refused_before_featurisation(
    tmp_path: Path, in_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad records are refused first (they are read before torch is imported); fp16 next, before any window is cut."""
    line = refused(flags(tmp_path / "out", "--mixed_precision", "fp16", "--max_train_steps", "1"), capsys)
    assert line.startswith("qa_train: error: --mixed_precision fp16: fp16 needs a CUDA GPU"), line
    assert not (tmp_path / "cache").exists(), "featurisation ran before the refusal"


def test_max_seq_length_beyond_the_position_embeddings_is_refused_before_featurisation(
    tmp_path: Path, in_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(flags(tmp_path / "out", "--max_seq_length", "1000", "--max_train_steps", "1"), capsys)
    assert "--max_seq_length 1000" in line and "512 position embeddings" in line
    assert not (tmp_path / "cache").exists(), "featurisation ran before the refusal"


@pytest.mark.usefixtures("in_process", "own_logging")
def test_resume_under_another_global_batch_is_refused_unless_allowed(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = old_run(finished, tmp_path)
    resume = ["--max_train_steps", "4", "--resume_from_checkpoint", "latest"]
    code, _, said = main_here(flags(out, *resume, "--per_device_train_batch_size", "4"), capsys)
    assert code == 2
    [line] = error_lines(said)
    assert "its global batch is 8, this run's is 4" in line and "add --allow_global_batch_change" in line

    # A checkpoint written by 2 processes (what a 2-rank DDP run records), resumed by 1 with a per-device batch no
    # accumulation turns into its global batch of 16.
    state_file = out / "checkpoints" / "step_00000003" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state.update(world_size=2, global_batch_size=16, per_device_train_batch_size=8)
    state_file.write_text(json.dumps(state))
    _refresh_manifest(state_file)
    code, _, said = main_here(flags(out, *resume, "--per_device_train_batch_size", "3"), capsys)
    assert code == 2
    [line] = error_lines(said)
    assert "its global batch is 16, this run's is 3" in line and "--allow_global_batch_change" in line

    # Allowed: step 3 of 16 windows (48 into the epoch) is step 1 of 32, and the 16 windows after it are trained again.
    allowed = [*resume, "--per_device_train_batch_size", "32", "--allow_global_batch_change", "--logging_steps", "1"]
    code, _, said = main_here(flags(out, *allowed), capsys)
    assert code == 0, said[-3000:]
    assert (
        "global batch 16 -> 32 (--allow_global_batch_change): step 3 of 16 windows continues as step 1 of 32, 48 "
        "windows into epoch 0 (its last 16 are trained again)" in said
    )
    # The old run's log after the new step 1 is dropped: steps 2-4 are the new global batch's.
    assert read_metrics(out)["train_steps"] == 4 and steps_in(out) == [1, 2, 3, 4]


def _refresh_manifest(changed: Path) -> None:
    """The test edits a file the manifest lists: record its new size and CRC32 so only the contract can object."""
    manifest_file = changed.parent / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["files"][changed.name] = changed.stat().st_size
    manifest["crc32"][changed.name] = zlib.crc32(changed.read_bytes())
    manifest_file.write_text(json.dumps(manifest))


@pytest.mark.usefixtures("in_process", "own_logging")
def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = old_run(finished, tmp_path)
    weights = out / "checkpoints" / "step_00000003" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    code, _, said = main_here(
        flags(tmp_path / "other", "--max_train_steps", "4", "--resume_from_checkpoint", str(weights.parent)), capsys
    )
    assert code == 2
    [line] = error_lines(said)
    assert str(weights.parent) in line and "model.safetensors" in line

    code, stdout, stderr = main_here(flags(out, "--max_train_steps", "4", "--resume_from_checkpoint", "latest"), capsys)
    logged = stdout + stderr
    assert code == 0, logged[-3000:]
    assert "step_00000003" in logged and "model.safetensors" in logged
    assert f"resumed from {out / 'checkpoints' / 'step_00000002'}" in logged
    # The damaged later one is set aside, not deleted, and not replaced by the resumed run's own step 3.
    aside = out / "checkpoints" / "step_00000003.abandoned" / "model.safetensors"
    assert aside.stat().st_size == 1000


@pytest.mark.usefixtures("in_process", "own_logging")
def test_a_checkpoint_damaged_at_its_own_size_is_skipped_not_loaded(
    finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes changed in place (a bad disk or copy) kept every size the manifest checks: the weights loaded altered
    without a word. The CRC32s catch it before anything is loaded."""
    out = old_run(finished, tmp_path)
    weights = out / "checkpoints" / "step_00000003" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a tensor: safetensors' own header check would not see it
    weights.write_bytes(bytes(data))
    code, _, said = main_here(
        flags(tmp_path / "other", "--max_train_steps", "4", "--resume_from_checkpoint", str(weights.parent)), capsys
    )
    assert code == 2
    [line] = error_lines(said)
    assert str(weights.parent) in line and "model.safetensors: its contents differ" in line

    code, stdout, stderr = main_here(flags(out, "--max_train_steps", "4", "--resume_from_checkpoint", "latest"), capsys)
    logged = stdout + stderr
    assert code == 0, logged[-3000:]
    assert (
        f"checkpoint {weights.parent} skipped: model.safetensors: its contents differ from the manifest's CRC32"
        in logged
    )
    assert f"resumed from {out / 'checkpoints' / 'step_00000002'}" in logged


def test_a_failed_export_keeps_metrics_json(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    # A file-size limit stands in for a full disk: the feature cache (< 1 MB) and metrics.json fit,
    # the tiny model's 3.7 MB of weights do not (Python ignores SIGXFSZ, so the write fails with EFBIG).
    limit = 2_000_000
    proc = subprocess.run(
        [PY, "-m", "qa_train", *tiny_flags(out, "--max_train_steps", "3")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    assert proc.returncode == 4, proc.stderr[-3000:]
    [line] = error_lines(proc.stderr)
    assert "export to" in line and "metrics.json is written" in line
    m = json.loads((out / "metrics.json").read_text())
    assert m["exact_match"] is not None and m["train_steps"] == 3
    assert not (out / "final").exists(), "no half-written export under the final name"
    assert not (out / ".tmp-final").exists(), "the partial export gives its space back"


def test_an_exported_model_is_readable_by_others(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        qa_train(out, "--max_train_steps", "1", "--checkpointing_steps", "1"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=lambda: os.umask(0o022),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    modes = {f.name: f.stat().st_mode & 0o777 for f in (out / "final").iterdir()}
    assert modes and set(modes.values()) == {0o644}, modes
    # A checkpoint's model.safetensors was 0600 where its other files were 0644 (issue 38, case 13).
    step = out / "checkpoints" / "step_00000001"
    modes = {f.name: f.stat().st_mode & 0o777 for f in step.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes


def test_bad_record_is_one_line_naming_file_and_record(
    tmp_path: Path, in_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(DEMO_DEV.read_text())
    del data["data"][0]["paragraphs"][0]["qas"][1]["id"]
    bad = tmp_path / "dev.json"
    bad.write_text(json.dumps(data))
    line = refused(tiny_flags(tmp_path / "out", "--max_train_steps", "1", "--validation_file", str(bad)), capsys)
    assert str(bad) in line and "data[0].paragraphs[0].qas[1]" in line


def test_preemption_exits_75_and_the_resumed_run_logs_each_step_once(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    cmd = qa_train(out, "--max_train_steps", "6", "--checkpointing_steps", "2", "--logging_steps", "1")
    run = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**env, "QA_TRAIN_TEST_HOLD_AT_STEP": "3"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (out / "HOLDING-rank0").exists():
        assert run.poll() is None and time.monotonic() < deadline, "the run never reached step 3"
        time.sleep(0.05)
    (out / "PREEMPT").touch()
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 75, stderr[-3000:]
    assert "stop requested: checkpoint saved at step 3" in stderr
    assert steps_in(out) == [1, 2, 3]

    # Resume from step 2 (as after a crash past its checkpoint): step 3 is trained and logged again, once.
    resumed = run_ok(
        [*cmd, "--resume_from_checkpoint", str(out / "checkpoints" / "step_00000002"), "--eval_on_start"]
        + ["--validation_file", str(DEMO_DEV)],  # tiny_flags leaves it out under --no_eval
        env,
    )
    assert steps_in(out) == [1, 2, 3, 4, 5, 6]
    evals = [
        json.loads(line)["step"]
        for line in (out / "train_log.jsonl").read_text().splitlines()
        if "eval/f1" in json.loads(line)
    ]
    assert evals == [2]  # the resumed model's evaluation, at its checkpoint's step (--no_eval: no final one)
    assert "at step 2 (resumed): exact_match" in resumed.stderr + resumed.stdout
    assert json.loads((out / "metrics.json").read_text())["initial_eval_step"] == 2
    assert "(at step 2, resumed: EM" in resumed.stdout and "untrained" not in resumed.stdout


def test_windows_too_short_for_the_stride_are_one_line(
    tmp_path: Path, in_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by a GPU-session dry run: a --max_seq_length that leaves no more context than --doc_stride after a
    question came out as a traceback; flags that leave a window no room for any question are now refused in
    one line naming both, before any data is read (a long question in roomier windows is cut instead)."""
    out = tmp_path / "out"
    line = refused(flags(out, "--max_seq_length", "24", "--doc_stride", "20"), capsys)
    assert "--doc_stride 20" in line and "--max_seq_length 24" in line and "at most 19" in line
    assert not (out / "metrics.json").exists()


def test_a_model_tokenizer_or_config_that_cannot_load_is_one_line_before_the_old_run_is_touched(
    finished: Path, tmp_path: Path, in_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers' own failures were tracebacks (exit 1); a model folder without weights failed only after
    --overwrite_output_dir had removed the old run."""
    out = old_run(finished, tmp_path)
    before = (out / "metrics.json").read_bytes()
    empty = tmp_path / "empty"
    empty.mkdir()
    for source, says in [
        (["--model_name_or_path", str(TINY)], f"--model_name_or_path {TINY}: no weights"),  # config and tokenizer only
        (["--config_name", str(DEMO_DEV)], f"--config_name {DEMO_DEV}: cannot load it (ValueError: "),
        (["--tokenizer_name", str(empty)], f"--tokenizer_name {empty}: cannot load it ("),
    ]:
        line = refused(flags(out, "--max_train_steps", "1", "--overwrite_output_dir", *source), capsys)
        assert says in line
        assert (out / "metrics.json").read_bytes() == before
