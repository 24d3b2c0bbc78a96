"""The memory planner as a command (`qa-train plan`), and its estimates against the peaks of real CPU trainings."""

from __future__ import annotations

from pathlib import Path

from conftest import PY, base_env, run_ok, tiny_flags, write_config

from qa_train.studies import memory_model as memplan
from qa_train.studies.planner_check import check_run

FLAGS = ["--num_gpus", "8", "--per_device_train_batch_size", "32", "--max_seq_length", "384"]


def test_cli_plans_bert_large_offline(tmp_path: Path) -> None:
    env = {**base_env(tmp_path), "HF_HOME": str(tmp_path / "empty-hf-home")}  # nothing cached: built-in shapes only
    large = run_ok(
        [
            PY,
            "-m",
            "qa_train.cli",
            "plan",
            "--model_name_or_path",
            "bert-large-uncased",
            "--gpu_memory_gib",
            "80",
            *FLAGS,
        ],
        env,
    ).stdout
    assert "334.1M parameters" in large and "recommended: ddp" in large
    for config in memplan.CONFIGS:
        assert f"| {config} |" in large


def test_estimate_is_within_20_percent_of_measured_cpu_peaks_for_two_model_sizes(tmp_path: Path) -> None:
    """Two real trainings (4 x 256 and 4 x 512 BERT shapes, every batch padded to the full length), then the
    planner's estimate of training memory against the host RSS each rank took above its idle baseline."""
    env = {**base_env(tmp_path), "OMP_NUM_THREADS": "2"}
    sizes = {
        "mini": {"hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024},
        "small": {"hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 2048},
    }
    for name, shape in sizes.items():
        config = write_config(tmp_path / name, num_hidden_layers=4, **shape)
        flags = tiny_flags(
            tmp_path / f"run-{name}",
            "--max_train_steps",
            "5",
            "--no_eval",
            "--pad_to_max_length",
            "--max_train_samples",
            "200",
            "--max_seq_length",
            "192",
            "--save_final_model",
            "false",
            "--run_name",
            name,
        )
        flags[flags.index("--config_name") + 1] = str(config)
        run_ok([PY, "-m", "qa_train", *flags], env)
        check = check_run(tmp_path / f"run-{name}")
        assert check.measured_gib is not None and check.measured_gib > 0.15, name  # mostly model states + activations
        print(f"{name}: estimate {check.estimate_gib:.3f} GiB, measured {check.measured_gib:.3f} GiB")
        assert 0.8 <= check.ratio <= 1.2, (name, check.estimate_gib, check.measured_gib)
