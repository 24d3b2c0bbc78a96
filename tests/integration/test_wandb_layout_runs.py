"""A W&B run laid out as Trainer's (transformers' WandbCallback), read from the offline `.wandb` records: the
optimizer step as every key's x-axis, Trainer's key names, the model config in the run config, WANDB_LOG_MODEL and
WANDB_WATCH honoured, a summary without duplicates or nulls; and TensorBoard's hyper-parameters in its run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PY, TINY, base_env, read_metrics, run_ok, tiny_flags

STEPS = 100  # WANDB_WATCH logs every max(100, --logging_steps) steps, as Trainer


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("layout")
    env = base_env(tmp)
    env.pop("WANDB_MODE", None)  # no credentials: offline by itself
    env.update(WANDB_LOG_MODEL="checkpoint", WANDB_WATCH="all")
    out = tmp / "run"
    flags = tiny_flags(out, "--max_train_steps", str(STEPS), "--logging_steps", "50", "--checkpointing_steps", "50")
    flags += ["--max_eval_samples", "32", "--logging_dir", str(tmp / "board")]
    flags[flags.index("--report_to") + 1] = "wandb,tensorboard"
    run_ok([PY, "-m", "qa_train", *flags], env)
    return out


def records(out: Path) -> list:
    import wandb_records as w

    return w.records(w.run_file(out))


def test_the_optimizer_step_is_every_keys_x_axis(run: Path) -> None:
    import wandb_records as w

    recs = records(run)
    metrics = [r.metric for r in recs if r.WhichOneof("record_type") == "metric"]
    declared = {(m.name or m.glob_name): m.step_metric for m in metrics}
    assert declared == {"train/global_step": "", "*": "train/global_step"}
    history = w.history(recs)
    assert history and all(row["train/global_step"] == row["_step"] for row in history)


def test_keys_are_trainers_where_trainer_has_the_figure(run: Path) -> None:
    import wandb_records as w

    keys = set().union(*w.history(records(run)))
    assert {"train/learning_rate", "train/epoch", "train/loss", "eval/runtime", "eval/exact_match"} <= keys
    assert {"throughput/samples_per_second", "memory/host_rss_gib"} <= keys, "ours, where Trainer has none"
    assert not keys & {"train/lr", "eval/runtime_s"}
    # WANDB_WATCH=all: gradients and parameters, at step 100
    watched = [row for row in w.history(records(run)) if any(k.startswith("gradients/") for k in row)]
    assert [row["_step"] for row in watched] == [STEPS]
    assert any(k.startswith("parameters/") for k in watched[0])


def test_the_run_config_holds_the_model_config_and_its_size(run: Path) -> None:
    import wandb_records as w

    config, model = w.config(records(run)), json.loads((TINY / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["vocab_size"]) == (
        model["model_type"],
        model["hidden_size"],
        model["vocab_size"],
    )
    assert config["model/num_parameters"] == read_metrics(run)["num_parameters"] > 0
    assert config["learning_rate"] == 1e-3 and config["token"] is None


def test_the_summary_holds_each_figure_once_and_no_null(run: Path) -> None:
    import wandb_records as w

    summary, m = w.summary(records(run)), read_metrics(run)
    assert None not in summary.values()
    assert not summary.keys() & {"exact_match", "f1", "eval_runtime_s", "train_loss", "squad_v2", "compile_time_s"}
    assert summary["eval/exact_match"] == pytest.approx(m["exact_match"]) and summary["eval/f1"] == pytest.approx(
        m["f1"]
    )
    assert summary["eval/runtime"] == pytest.approx(m["eval_runtime_s"], abs=1e-3)


def test_wandb_log_model_checkpoint_logs_every_checkpoint_and_the_export(run: Path) -> None:
    import wandb_records as w

    models = [a for a in w.artifacts(records(run)) if a.type == "model"]
    aliases = [sorted(set(a.aliases) - {"latest"}) for a in models]
    assert [[x for x in a if x.startswith("checkpoint_global_step_")] for a in aliases] == [
        ["checkpoint_global_step_50"],
        ["checkpoint_global_step_100"],
        [],
    ]
    assert "final" in aliases[-1] and all(a.name == models[0].name for a in models), "versions of one artifact"
    # --checkpointing_steps 50: at steps 50 and 100, and nowhere else
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000050", "step_00000100"]


def test_tensorboard_hyperparameters_are_in_the_run_with_its_scalars(run: Path) -> None:
    """accelerate writes them to a timestamped folder of their own (and hparams.yml): two more TensorBoard runs."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    board = run.parent / "board"
    assert [p.name.split(".")[0] for p in board.iterdir()] == ["events"], list(board.iterdir())
    assert not (run / "tensorboard").exists(), "--logging_dir replaces output_dir/tensorboard"
    events = EventAccumulator(str(board))
    events.Reload()
    assert "eval/f1" in events.Tags()["scalars"]
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    assert start.session_start_info.hparams["learning_rate"].number_value == 1e-3
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in experiment.metric_infos] == ["eval/exact_match", "eval/f1", "train/loss"]
