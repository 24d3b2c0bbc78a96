"""The hub path end to end: docs/training.md's recipe for SQuAD on a machine without the hub, and each failure of
the hub path as `python -m qa_train` reports it (one line, exit 2, before the model's weights are loaded)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import DEMO_TRAIN, PY, ROOT, TINY, base_env, read_metrics, run_cmd, run_ok
from hub_folders import hub_download

from qa_train.data.load import load_file


def hub_flags(dataset: str, out: Path, *extra: str) -> list[str]:
    """A short run of the tiny BERT on a --dataset_name instead of local files."""
    model = ["--config_name", str(TINY), "--tokenizer_name", str(TINY)]
    short = "--max_seq_length 192 --doc_stride 64 --max_train_steps 2 --max_eval_samples 16 --report_to none".split()
    return [PY, "-m", "qa_train", *model, "--dataset_name", dataset, *short, "--output_dir", str(out), *extra]


def recipe_command() -> str:
    """The docs' save_to_disk command, as a user copies it."""
    text = (ROOT / "docs" / "training.md").read_text()
    section = text.split("### SQuAD on a machine without the hub", 1)[1].split("\n## ", 1)[0]
    [command] = re.findall(r"^    (python -c .*save_to_disk.*)$", section, flags=re.MULTILINE)
    return command


def test_the_docs_recipe_prepares_squad_for_a_machine_without_the_hub(tmp_path: Path) -> None:
    """rajpurkar/squad is replaced by a folder in its layout (no test has a network); save_to_disk's folder and the
    parquet folder both train with the hub off."""
    hub = hub_download(tmp_path / "hub" / "squad")
    command = recipe_command().replace("'rajpurkar/squad'", repr(str(hub)))
    env = base_env(tmp_path)
    subprocess.run(command, shell=True, cwd=tmp_path, env=env, check=True, capture_output=True, timeout=300)
    assert (tmp_path / "squad-saved" / "dataset_dict.json").is_file()

    questions = len(load_file(DEMO_TRAIN))
    for name, folder in (("saved", tmp_path / "squad-saved"), ("parquet", hub)):
        out = tmp_path / name
        run_ok(hub_flags(str(folder), out), env)  # base_env sets HF_HUB_OFFLINE and HF_DATASETS_OFFLINE
        m = read_metrics(out)
        assert (m["num_train_examples"], m["num_eval_examples"], m["train_steps"]) == (questions, 16, 2), name
        assert m["args"]["dataset_name"] == str(folder)


@pytest.fixture(scope="module")
def parquet_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hub_download(tmp_path_factory.mktemp("hub") / "squad")


@pytest.mark.parametrize(
    ("dataset", "extra", "says"),
    [
        # The default --dataset_name squad with the hub off: a 34-line ConnectionError traceback before.
        (
            None,
            (),
            "--dataset_name squad: cannot be loaded with the hub off (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE); "
            "prepare it where the hub is reachable and pass its folder (docs/training.md, 'SQuAD on a machine "
            "without the hub'), or pass --train_file and --validation_file",
        ),
        # A mistyped local folder: 32 lines of FileNotFoundError before.
        ("./squad-local", (), "--dataset_name ./squad-local: no such folder (a hub dataset is named name or org/name)"),
        # A wrong config: a ValueError traceback before.
        ("FOLDER", ("--dataset_config_name", "nope"), "--dataset_config_name nope: "),
    ],
    ids=["hub-off", "mistyped-folder", "wrong-config"],
)
def test_a_hub_path_failure_is_one_line_with_exit_2(
    dataset: str | None, extra: tuple[str, ...], says: str, parquet_folder: Path, tmp_path: Path
) -> None:
    flags = hub_flags(str(parquet_folder) if dataset == "FOLDER" else dataset or "squad", tmp_path / "o", *extra)
    if dataset is None:
        i = flags.index("--dataset_name")
        del flags[i : i + 2]  # the default, as a user who names no data gets it
    proc = run_cmd(flags, base_env(tmp_path))
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"qa_train: error: {says}"), line
    assert not (tmp_path / "o" / "metrics.json").exists()
