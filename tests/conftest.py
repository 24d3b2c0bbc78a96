"""Shared fixtures: the bundled tiny model and demo data, and a runner for the real entry points.

tests/unit holds the tests that start no process and run no training loop (`make test-fast`); tests/integration the
rest. The helpers both import live here, beside this file: families.py, fake_runs.py, fake_accelerator.py,
oom_faults.py, squad_cases.py."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import slurm_cluster
from filelock import FileLock

# Two pytest workers share the cores: an idle OpenMP thread must sleep, not spin, or a 2-thread run burns the
# other worker's core waiting (set before this process or any run it starts loads torch).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "qa_train" / "assets"
TINY = ASSETS / "tiny-bert"
DEMO_TRAIN = ASSETS / "demo" / "train.json"
DEMO_DEV = ASSETS / "demo" / "dev.json"


def export_answers(model_dir: Path, questions: int | None = None, **predictor: str) -> dict[str, str]:
    """An exported model's answers to the demo dev set (its first `questions`), in tiny_flags' windows."""
    from qa_train.config.settings import DataArgs
    from qa_train.data.load import load_file
    from qa_train.predict import Predictor

    data = DataArgs(dataset_name=None, max_seq_length=192, doc_stride=64, per_device_eval_batch_size=32)
    examples = load_file(str(DEMO_DEV), "required")
    return (
        Predictor(str(model_dir), data, **predictor)
        .predict(examples if questions is None else examples.head(questions))
        .predictions
    )


def write_config(folder: Path, **sizes: object) -> Path:
    """The tiny BERT's config with other sizes: a model shape for the tests, built locally."""
    config = json.loads((TINY / "config.json").read_text())
    config.update(sizes)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def tiny_flags(output_dir: Path, *extra: str) -> list[str]:
    """A short real run of the bundled tiny BERT on the bundled demo data; with --no_eval (and no --eval_on_start)
    without the evaluation's file and batch size, which nothing would read (training refuses them)."""
    evaluates = True  # the last of --no_eval and --do_eval X decides, as on the command line
    for flag, value in zip(extra, [*extra[1:], ""]):
        if flag == "--no_eval":
            evaluates = False
        elif flag == "--do_eval":
            evaluates = value.lower() in ("true", "1", "yes")
    evaluates |= "--eval_on_start" in extra
    return [
        "--config_name",
        str(TINY),
        "--tokenizer_name",
        str(TINY),
        "--train_file",
        str(DEMO_TRAIN),
        *(["--validation_file", str(DEMO_DEV), "--per_device_eval_batch_size", "32"] if evaluates else []),
        "--max_seq_length",
        "192",
        "--doc_stride",
        "64",
        "--per_device_train_batch_size",
        "8",
        "--learning_rate",
        "1e-3",
        "--report_to",
        "none",
        "--output_dir",
        str(output_dir),
        *extra,
    ]


PAST_PREFLIGHT = "past the preflight"


def preflight_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> str:
    """What the Trainer says of the tiny run with `flags` in place of its --config_name/--tokenizer_name: its
    refusal, or PAST_PREFLIGHT where it got as far as reading the data (nothing is read or trained)."""
    from qa_train import trainer
    from qa_train.config.flags import parse_args
    from qa_train.config.settings import ConfigError

    class Past(Exception):
        pass

    def past(*args: object) -> None:
        raise Past

    monkeypatch.setattr(trainer, "load_splits", past)
    argv = tiny_flags(tmp_path / "out", "--no_eval")
    for flag in ("--config_name", "--tokenizer_name"):
        at = argv.index(flag)
        del argv[at : at + 2]
    try:
        trainer.Trainer(parse_args([*argv, *flags]))
    except ConfigError as err:
        return str(err)
    except Past:
        return PAST_PREFLIGHT
    raise AssertionError("the Trainer was built without reading its data")


def cpu_launch(config: str, main_port: int, processes: int = 2) -> list[str]:
    """`qa-train launch --cpu` of accelerate_configs/CONFIG.yaml (or a YAML path) up to its `--`; the training
    flags follow."""
    path = config if config.endswith(".yaml") else f"accelerate_configs/{config}.yaml"
    return [
        PY,
        "-m",
        "qa_train.cli",
        "launch",
        "--cpu",
        "--config_file",
        path,
        "--num_processes",
        str(processes),
        "--main_process_port",
        str(main_port),
        "--",
    ]


def base_env(tmp_path: Path) -> dict[str, str]:
    from qa_train.strategy.op_builds import environment_build_root

    env = dict(os.environ)
    env.update(
        {
            "QA_TRAIN_CACHE": str(tmp_path / "cache"),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            # datasets caches a local folder under its base name: a test's `squad` folder must not become the
            # machine's cached squad (which an offline run of the default --dataset_name would then read).
            "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets"),
            "TOKENIZERS_PARALLELISM": "false",
            "WANDB_SILENT": "true",
            "PYTHONUNBUFFERED": "1",
            # A rank that aborts prints every thread's Python stack (how the abort at exit of 2-process ZeRO-3
            # probes in CI was first chased: docs/benchmarks/2026-11-27-cpu-exit-abort.md).
            "PYTHONFAULTHANDLER": "1",
            # The venv's tools first, as `make install` built DeepSpeed's ops with them: two ninja versions
            # (pip's and the system's) disagree on the build log's hashes, and each then rebuilds the ops
            # (~40 s a launch).
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            # Where `make install` built them and qa_train's ranks load them (op_builds.prepare): the probes that
            # run DeepSpeed without qa_train would otherwise rebuild them in torch's default folder.
            "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR") or str(environment_build_root()),
            # The tests' own torchrun launches (not through qa_train's agent, which names it itself) would leave a
            # /tmp/torchelastic_* folder each: about 70 a run of the suite.
            "PET_LOG_DIR": os.devnull,
        }
    )
    env.pop("WANDB_API_KEY", None)
    # torch writes its default inductor cache folder into the environment of any process that looked for it (this
    # one may have): each run resolves its own, and a batch script's default is the one it sets.
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    return env


def exit_probe_env(folder: Path) -> dict[str, str]:
    """The environment that makes each process of a run write what it left alive at exit into `folder`
    (tests/integration/exit_probe)."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = ROOT / "tests" / "integration" / "exit_probe"
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(probe), os.environ.get("PYTHONPATH")])),
        "QA_TRAIN_TEST_EXIT_PROBE": str(folder),
    }


def run_cmd(cmd: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return proc


def run_ok(cmd: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    proc = run_cmd(cmd, env, timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    )
    return proc


def error_lines(stderr: str) -> list[str]:
    """The one-line errors `python -m qa_train` printed; a traceback instead of them fails the test."""
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.startswith("qa_train: error:")]


def read_metrics(output_dir: Path) -> dict:
    return json.loads((output_dir / "metrics.json").read_text())


PY = sys.executable


def port(base: int) -> int:
    """A rendezvous port for a launch, in this pytest worker's own range: under `pytest -n N` (pytest-xdist) tests
    run side by side, and two launches on one port would fail, or join each other's world. Each test has its own
    base (29500-29899), all below the ephemeral ports that gloo's connections take."""
    assert 29500 <= base < 29900, base
    return base + 400 * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return base_env(tmp_path)


@pytest.fixture
def in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What base_env gives a subprocess that matters to qa_train's main() run in this process: its own feature
    cache, rank 0."""
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RANK", raising=False)


def main_here(
    argv: list[str], capsys: pytest.CaptureFixture[str], main: Callable[[list[str]], int] | None = None
) -> tuple[int, str, str]:
    """`python -m qa_train`'s main (or another verb's `main`, as `qa-train predict`'s) in this process, a whole run
    included (a subprocess spends ~6 s importing the libraries before its first line): its exit code, stdout and
    stderr. Its tests take `in_process`, and `own_logging` where the run gets as far as logging."""
    if main is None:
        from qa_train.__main__ import main

    capsys.readouterr()
    code = main(argv)
    said = capsys.readouterr()
    return code, said.out, said.err


@pytest.fixture
def own_logging():
    """main() in this process points the root logger at the test's captured stderr, closed once the test ends: later
    tests must not log there."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


# Set by .ci/run, which installs SLURM: there a missing cluster fails the SLURM tests instead of skipping them.
REQUIRE_SLURM = "QA_TRAIN_REQUIRE_SLURM"


@pytest.fixture(scope="session")
def slurm() -> Iterator[slurm_cluster.Cluster]:
    """A real two-node SLURM (tests/slurm_cluster.py) for this pytest process, stopped at the end, also on failure.
    Skipped only where SLURM is not installed and REQUIRE_SLURM is unset (a laptop)."""
    absent = slurm_cluster.missing()
    if absent:
        why = f"SLURM is not installed (no {', '.join(absent)}): `python3 tests/slurm_cluster.py install` as root"
        if os.environ.get(REQUIRE_SLURM) == "1":
            pytest.fail(f"{REQUIRE_SLURM}=1: {why}")
        pytest.skip(why)
    # Not pytest's tmp_path: munged wants a socket folder that others may traverse, and pytest's are private.
    directory = Path(tempfile.mkdtemp(prefix="qa-train-slurm-"))
    try:
        yield slurm_cluster.start(directory)
    finally:
        slurm_cluster.stop(directory)
        shutil.rmtree(directory, ignore_errors=True)


def high_padding_model(out: Path) -> Path:
    """The bundled tiny BERT, randomly initialised, with padding logits above every real token's: the
    [PAD] embedding is one large feature that the QA head reads. With candidates picked over the whole
    padded row, padding would take the top-n slots, and answers would depend on how much of it a batch has."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, BertForQuestionAnswering

    tokenizer = AutoTokenizer.from_pretrained(TINY)
    torch.manual_seed(0)
    model = BertForQuestionAnswering(AutoConfig.from_pretrained(TINY))
    with torch.no_grad():
        pad = model.bert.embeddings.word_embeddings.weight[tokenizer.pad_token_id]
        pad.zero_()
        pad[0] = 50.0
        model.qa_outputs.weight[:, 0] = 3.0
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


# Seconds the slowest files take in `make test` (measured, rounded: only the order matters). Its two workers take
# whole files in order (--dist loadfile --no-loadscope-reorder): a long file started last would run on alone.
SLOW_FILES = {
    "test_strategies.py": 230,
    "test_resume_anywhere_runs.py": 210,
    "test_slurm_cluster.py": 130,
    "test_launch_signals_runs.py": 90,
    "test_report_runs.py": 85,
    "test_hangs.py": 65,
    "test_eval_only_runs.py": 60,
    "test_compile_runs.py": 55,  # inductor's cache test: two processes' real compile
    "test_families_runs.py": 45,
    "test_e2e.py": 45,
    "test_faults.py": 45,
    "test_disk_full_runs.py": 40,
    "test_plan_runs.py": 40,
    "test_predict_runs.py": 30,
    "test_progress_runs.py": 25,
    "test_slurm.py": 20,
    "test_tracking_runs.py": 20,
    "test_best_runs.py": 20,
    "test_hub_runs.py": 20,
    "test_v2_demo.py": 15,
    "test_wandb_layout_runs.py": 15,
    "test_monitor_runs.py": 15,
    "test_dirlock_runs.py": 15,
    "test_portable_deepspeed_runs.py": 5,  # reads the DeepSpeed probes' session launch (deepspeed_probes)
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slowest files first, then the other integration files, the unit tests last (small files fill the gaps at
    the end). The sort is stable: a file's own tests keep their order."""
    items.sort(key=lambda item: (-SLOW_FILES.get(item.path.name, 0), item.path.parent.name == "unit"))


def freeze_what_lives() -> None:
    """Collect once, then take every object alive out of the collector's sight (gc.freeze), as a rank does once it is
    built (qa_train/core/collector.py): the test modules and what they imported, torch and transformers among them,
    live as long as this pytest process, and each full collection while the tests run would walk them all again."""
    gc.collect()
    gc.freeze()


def pytest_collectstart(collector: pytest.Collector) -> None:
    if isinstance(collector, pytest.Session):  # the test modules import from here on (pytest-xdist's controller never)
        gc.disable()


def pytest_collection_finish(session: pytest.Session) -> None:
    freeze_what_lives()
    gc.enable()


def shared_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `make` fills, once for the whole session: under pytest-xdist the workers share it (the first to need
    it makes it under a file lock; another waits for it), so test files running side by side do not each launch the
    same runs."""
    base = factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the session's folder, or this one
    folder = shared / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{folder}.lock"):
        if not (folder / "DONE").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / "DONE").touch()
    return folder


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """One uninterrupted run per config (8 steps, a checkpoint every 4) for the whole session (shared_once), so the
    strategy files can run side by side without each launching the same references."""

    def launch(config: str, folder: Path) -> None:
        from strategy_runs import launch_cmd  # tests/integration, on the path once a test there is collected

        # DDP, the reference, also evaluates: evaluation comes after training and changes no step. FSDP recomputes
        # each layer in the backward pass, which must gather its sharded weights again: its match with DDP holds
        # that too (one launch fewer than a run of its own).
        extra = {"ddp": ("--do_eval", "true"), "fsdp": ("--gradient_checkpointing",)}.get(config, ())
        env = base_env(folder)
        if config == "fsdp":  # test_strategies.py reads what its ranks left alive at exit
            env.update(exit_probe_env(folder / "exit"))
        run_ok(launch_cmd(config, folder / "run", *extra), env)

    return lambda config: shared_once(tmp_path_factory, f"uninterrupted/{config}", partial(launch, config)) / "run"


# The cases of tests/integration/deepspeed_probes.py, each a folder of deepspeed_probes()'s.
DEEPSPEED_PROBES = ("checkpoint:2:none", "export:2", "checkpoint:3:offload", "export:3")


@pytest.fixture(scope="session")
def deepspeed_probes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case of tests/integration/deepspeed_probes.py, in one torchrun launch of two processes for the session
    (shared_once): test_strategies.py's exports and test_portable_deepspeed_runs.py's checkpoints."""

    def launch(folder: Path) -> None:
        from strategy_runs import PORTS

        env = {**base_env(folder), "ACCELERATE_USE_DEEPSPEED": "true", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
        probes = ROOT / "tests" / "integration" / "deepspeed_probes.py"
        cmd = [PY, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(next(PORTS))]
        run_ok([*cmd, str(probes), str(folder), *DEEPSPEED_PROBES], env)

    return shared_once(tmp_path_factory, "deepspeed-probes", launch)
