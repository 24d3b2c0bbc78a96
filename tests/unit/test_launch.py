"""qa_train.strategy.launch without launching: config refusals, the command each branch builds, --dry_run."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from qa_train.strategy import launch, supervise
from qa_train.strategy.checks import cpu_threads
from qa_train.strategy.launch import LaunchConfigError, build_command, cpu_refusal, parse, read_config

DS_YAML = """\
distributed_type: DEEPSPEED
deepspeed_config:
  deepspeed_config_file: ds/zero2.json
num_processes: 2
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def ds_dir(tmp_path: Path) -> Path:
    """A launch directory holding a DeepSpeed JSON at ds/zero2.json."""
    write(tmp_path / "ds" / "zero2.json", json.dumps({"zero_optimization": {"stage": 2}}))
    return tmp_path


# --- read_config -------------------------------------------------------------------------------


def test_read_config_returns_the_yaml(ds_dir: Path) -> None:
    cfg = read_config(str(write(ds_dir / "zero2.yaml", DS_YAML)), launch_dir=ds_dir)
    assert cfg["distributed_type"] == "DEEPSPEED"
    assert cfg["deepspeed_config"]["deepspeed_config_file"] == "ds/zero2.json"


def test_missing_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(LaunchConfigError, match=f"--config_file {path}: no such file"):
        read_config(str(path))


def test_a_directory_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(LaunchConfigError, match="no such file"):
        read_config(str(tmp_path))


def test_invalid_yaml_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.yaml", "distributed_type: [MULTI_GPU\nnum_processes: 2\n")
    with pytest.raises(LaunchConfigError, match=f"--config_file {path}: not valid YAML"):
        read_config(str(path))


def test_invalid_yaml_or_a_binary_file_is_one_line(tmp_path: Path) -> None:
    """yaml's message spans four lines (the mark and a caret under it); a binary file was a UnicodeDecodeError
    traceback."""
    path = write(tmp_path / "bad.yaml", "a: 1\n  b: 2\n")
    with pytest.raises(LaunchConfigError) as refused:
        read_config(str(path))
    assert (
        str(refused.value)
        == f"--config_file {path}: not valid YAML: line 2, column 4: mapping values are not allowed here"
    )
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(b"\xf0\x00\x81binary")
    with pytest.raises(
        LaunchConfigError, match=rf"^--config_file {binary}: not UTF-8 text \(byte 0\), so not an accelerate config$"
    ):
        read_config(str(binary))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "distributed_type: DEEPSPED\n",
            "distributed_type 'DEEPSPED' is not one of accelerate's (did you mean DEEPSPEED?)",
        ),
        (
            "distributed_typ: DEEPSPEED\n",
            "unknown key 'distributed_typ' (did you mean distributed_type?); accelerate's config",
        ),
        ("distributed_type: MULTI_GPU\nnum_procs: 2\n", "unknown key 'num_procs' (did you mean num_processes?)"),
        ("", "empty; an accelerate config names its distributed_type"),
        ("num_processes: 2\n", "no distributed_type; accelerate needs one of NO, MULTI_CPU, MULTI_GPU"),
        (
            "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stag: 3\n",
            "deepspeed_config: unknown key 'zero_stag' (did you mean zero_stage?), so accelerate launch would ignore it",
        ),
        (
            "distributed_type: FSDP\nfsdp_config:\n  fsdp_verison: 2\n",
            "fsdp_config: unknown key 'fsdp_verison' (did you mean fsdp_version?)",
        ),
        (
            "distributed_type: MULTI_GPU\ncompute_environment: AMAZON_SAGEMAKR\n",
            "compute_environment 'AMAZON_SAGEMAKR' is not one of accelerate's (did you mean AMAZON_SAGEMAKER?)",
        ),
    ],
    ids=["value", "key", "unknown-key", "empty", "no-type", "deepspeed-key", "fsdp-key", "environment"],
)
def test_a_config_accelerate_would_refuse_or_ignore_is_refused_naming_the_key(
    text: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelled DEEPSPEED (or key, or an empty file) ran plain DDP on CPU, with exit 0 and strategy: ddp recorded
    (issue 38, case 3): torchrun's path never hands the file to accelerate, whose loader refuses all of these."""
    from accelerate.commands.config.config_args import ClusterConfig

    path = write(tmp_path / "typo.yaml", text)
    with pytest.raises(LaunchConfigError) as refused:
        read_config(str(path))
    assert str(refused.value).startswith(f"--config_file {path}: {said}")
    if "config:" not in text:  # accelerate's own loader agrees (it says nothing of the strategy sections' keys)
        with pytest.raises((ValueError, TypeError)):
            ClusterConfig.from_yaml_file(str(path))
    assert launch.main(["--cpu", "--config_file", str(path), "--dry_run", "--", "--output_dir", "x"]) == 2
    assert capsys.readouterr().err.strip() == f"qa-train launch: error: {refused.value}"
    # Launched for real, the agent that starts the ranks refuses it (the launcher leaves accelerate's checks to it),
    # in the same one line: the agent says the command only once the config passed.
    assert agent_refuses(path, monkeypatch) == 2
    assert capsys.readouterr().err.strip() == f"qa-train launch: error: {refused.value}"


@pytest.mark.parametrize("value", ["bf61", "BF-16", "fp32"])
def test_a_mixed_precision_accelerate_does_not_have_is_refused_naming_it(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accelerate's loader takes any mixed_precision, and accelerate launch refuses a typo only on GPUs (in a
    traceback); on CPU, torchrun's DDP never read it, and the run trained in fp32 without a word."""
    path = write(tmp_path / "typo.yaml", f"distributed_type: MULTI_GPU\nmixed_precision: {value}\n")
    said = f"--config_file {path}: mixed_precision {value!r} is not one of accelerate's"
    with pytest.raises(LaunchConfigError, match=f"^{re.escape(said)}.*: no, fp8, fp16, bf16$"):
        read_config(str(path))
    assert agent_refuses(path, monkeypatch) == 2
    assert capsys.readouterr().err.startswith(f"qa-train launch: error: {said}")
    for accepted in ("no", "'no'", "BF16", "fp16"):  # the first is YAML's False
        read_config(str(write(path, f"distributed_type: MULTI_GPU\nmixed_precision: {accepted}\n")))


def agent_refuses(config: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """`qa-train launch --cpu` of `config` on 2 processes, its agent run here: the agent's exit code."""
    from qa_train.strategy import agent

    def run_agent(cmd: list[str], env: dict[str, str], grace_s: float) -> int:
        assert cmd[:3] == [sys.executable, "-m", "qa_train.strategy.agent"], cmd
        monkeypatch.setattr(agent, "_start", lambda which, args: pytest.fail(f"the agent started {which} {args}"))
        return agent.main(cmd[3:])

    monkeypatch.setattr(launch, "run_launch", run_agent)
    return launch.main(["--cpu", "--config_file", str(config), "--num_processes", "2", "--", "--output_dir", "x"])


def test_the_agent_says_the_command_once_the_config_passed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from qa_train.strategy import agent

    started: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(agent, "_start", lambda which, args: started.append((which, args)))
    monkeypatch.setattr(launch, "run_launch", lambda cmd, env, grace_s: agent.main(cmd[3:]))
    argv = [
        "--cpu",
        "--config_file",
        str(ROOT / "accelerate_configs" / "ddp.yaml"),
        "--num_processes",
        "2",
        "--",
        "--x",
        "1",
    ]
    assert launch.main(argv) == 0
    [(which, args)] = started
    assert which == "torchrun" and args[-4:] == ["-m", "qa_train", "--x", "1"] and "--echo" not in args
    # The command as a user would run it; the agent adds only its log folder (agent.without_log_folder).
    assert args[:2] == ["--log_dir", os.devnull]
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"+ {sys.executable} -m torch.distributed.run {' '.join(args[2:])}"


def test_the_agent_refuses_a_bad_config_before_accelerate_launch(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """slurm/train.sbatch's GPU path runs `accelerate launch` through the agent: one line and exit 2, where accelerate
    raised a traceback and exit 1 (and ignores a misspelled key of deepspeed_config)."""
    from qa_train.strategy import agent

    path = write(tmp_path / "typo.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stag: 3\n")
    assert agent.main(["accelerate", "--config_file", str(path), "--num_processes", "2", "-m", "qa_train"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"qa-train launch: error: --config_file {path}: deepspeed_config: unknown key 'zero_stag' (did you mean "
        "zero_stage?), so accelerate launch would ignore it"
    )


def test_fsdp_keys_without_their_prefix_are_read_as_accelerate_reads_them(tmp_path: Path) -> None:
    path = write(
        tmp_path / "fsdp.yaml", "distributed_type: FSDP\nfsdp_config:\n  version: 2\n  offload_params: false\n"
    )
    assert cpu_refusal(read_config(str(path))) is None


def test_deepspeed_json_is_resolved_against_launch_dir(ds_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = write(ds_dir / "zero2.yaml", DS_YAML)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    with pytest.raises(LaunchConfigError) as err:
        read_config(str(path), launch_dir=elsewhere)
    assert str(path) in str(err.value)
    assert "deepspeed_config_file ds/zero2.json does not exist" in str(err.value)
    assert "relative to the directory you launch from" in str(err.value)


def test_deepspeed_json_defaults_to_cwd(
    ds_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = write(ds_dir / "zero2.yaml", DS_YAML)
    monkeypatch.chdir(ds_dir)
    assert read_config(str(path))["distributed_type"] == "DEEPSPEED"
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    with pytest.raises(LaunchConfigError, match="ds/zero2.json does not exist"):
        read_config(str(path))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("gradient_accumulation_steps", 4),
        ("gradient_clipping", 1.0),
        ("zero_stage", 2),
        ("offload_optimizer_device", "cpu"),
        ("offload_param_device", "cpu"),
        ("zero3_save_16bit_model", True),
        ("mixed_precision", "bf16"),
    ],
)
def test_flag_decided_keys_next_to_a_json_are_refused(ds_dir: Path, key: str, value: object) -> None:
    cfg = yaml.safe_load(DS_YAML)
    cfg["deepspeed_config"][key] = value
    path = write(ds_dir / "clash.yaml", yaml.safe_dump(cfg))
    with pytest.raises(LaunchConfigError) as err:
        read_config(str(path), launch_dir=ds_dir)
    msg = str(err.value)
    assert msg.startswith(f"{path}: {key} must not be set next to deepspeed_config_file ds/zero2.json")
    assert '"auto"' in msg


def test_every_clashing_key_is_named(ds_dir: Path) -> None:
    cfg = yaml.safe_load(DS_YAML)
    cfg["deepspeed_config"].update(zero_stage=3, gradient_accumulation_steps=2)
    path = write(ds_dir / "clash.yaml", yaml.safe_dump(cfg))
    with pytest.raises(LaunchConfigError, match="gradient_accumulation_steps, zero_stage must not be set"):
        read_config(str(path), launch_dir=ds_dir)


def test_flag_decided_keys_without_a_json_are_accepted(tmp_path: Path) -> None:
    """accelerate's inline DeepSpeed settings are fine when no JSON is given."""
    path = write(
        tmp_path / "inline.yaml",
        "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
        "  zero_stage: 2\n  gradient_accumulation_steps: 4\nmixed_precision: bf16\n",
    )
    assert read_config(str(path))["deepspeed_config"]["zero_stage"] == 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_top_level_mixed_precision_next_to_a_json_is_refused(ds_dir: Path, precision: str) -> None:
    path = write(ds_dir / "mp.yaml", DS_YAML + f"mixed_precision: {precision}\n")
    with pytest.raises(LaunchConfigError) as err:
        read_config(str(path), launch_dir=ds_dir)
    assert str(err.value).startswith(f"{path}: mixed_precision must not be set next to deepspeed_config_file")
    assert "--mixed_precision" in str(err.value)


def test_top_level_mixed_precision_no_next_to_a_json_is_accepted(ds_dir: Path) -> None:
    path = write(ds_dir / "mp.yaml", DS_YAML + "mixed_precision: 'no'\n")
    assert read_config(str(path), launch_dir=ds_dir)["mixed_precision"] == "no"


def test_a_yaml_that_is_not_a_mapping_is_refused_as_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path / "list.yaml", "- distributed_type: MULTI_GPU\n")
    with pytest.raises(LaunchConfigError, match=f"{path}: not an accelerate config"):
        read_config(str(path))
    path = write(tmp_path / "scalar.yaml", "deepspeed_config: foo\n")
    with pytest.raises(LaunchConfigError, match=f"{path}: not an accelerate config"):
        read_config(str(path))


# --- the repository's own configs --------------------------------------------------------------

REPO_CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))
# Values qa_train.strategy.deepspeed_json.reconcile_deepspeed fills from flags: the JSON must leave them to the flags.
FLAG_DECIDED = [
    ("train_micro_batch_size_per_gpu",),
    ("train_batch_size",),
    ("gradient_accumulation_steps",),
    ("gradient_clipping",),
    ("bf16", "enabled"),
    ("fp16", "enabled"),
]
OPTIMIZER_FLAG_DECIDED = ["lr", "betas", "eps", "weight_decay"]


def test_repository_ships_the_expected_configs() -> None:
    assert {p.stem for p in REPO_CONFIGS} >= {"single", "ddp", "fsdp", "zero1", "zero2", "zero3"}


@pytest.mark.parametrize("path", REPO_CONFIGS, ids=lambda p: p.name)
def test_repository_config_passes_read_config(path: Path) -> None:
    cfg = read_config(str(path), launch_dir=ROOT)
    assert cfg["distributed_type"] in {"NO", "MULTI_GPU", "FSDP", "DEEPSPEED"}


@pytest.mark.parametrize(
    "path",
    [p for p in REPO_CONFIGS if yaml.safe_load(p.read_text())["distributed_type"] == "DEEPSPEED"],
    ids=lambda p: p.name,
)
def test_repository_deepspeed_json_leaves_flag_decided_values_to_flags(path: Path) -> None:
    ds_file = read_config(str(path), launch_dir=ROOT)["deepspeed_config"]["deepspeed_config_file"]
    assert Path(ds_file).parts[0] == "ds_configs"
    ds = json.loads((ROOT / ds_file).read_text())
    for keys in FLAG_DECIDED:
        value = ds
        for key in keys:
            value = value[key]
        assert value == "auto", f'{ds_file}: {".".join(keys)} is {value!r}, not "auto"'
    params = ds.get("optimizer", {}).get("params")
    if params is not None:
        for key in OPTIMIZER_FLAG_DECIDED:
            assert params.get(key) == "auto", f"{ds_file}: optimizer.params.{key} is {params.get(key)!r}"


def test_every_shipped_config_runs_on_cpu_and_only_fsdp_offload_is_refused() -> None:
    reasons = {p.stem: cpu_refusal(yaml.safe_load(p.read_text())) for p in REPO_CONFIGS}
    assert set(reasons.values()) == {None}
    assert cpu_refusal({}) is None  # no distributed_type: accelerate's NO
    offload = {**FSDP, "fsdp_config": {"fsdp_version": 2, "fsdp_offload_params": True}}
    assert cpu_refusal(offload).startswith("fsdp_offload_params: true offloads to the host from an accelerator")
    assert cpu_refusal({**FSDP, "fsdp_config": {"fsdp_version": 2, "fsdp_offload_params": False}}) is None
    for fsdp1 in ({}, {"fsdp_version": 1}):  # accelerate's FSDP1 needs a device to sync module states
        assert (
            cpu_refusal({**FSDP, "fsdp_config": fsdp1}) == "FSDP on CPU processes is FSDP2: set fsdp_version: 2 "
            "under fsdp_config"
        )


# --- parse -------------------------------------------------------------------------------------


def test_parse_splits_at_double_dash() -> None:
    opts, train = parse(["--config_file", "c.yaml", "--cpu", "--", "--output_dir", "out", "--dry_run", "--cpu"])
    assert (opts.config_file, opts.cpu, opts.dry_run) == ("c.yaml", True, False)
    assert train == ["--output_dir", "out", "--dry_run", "--cpu"]


def test_parse_forwards_unknown_flags_before_the_double_dash() -> None:
    opts, train = parse(["--config_file", "c.yaml", "--max_seq_length", "128", "--", "--output_dir", "out"])
    assert opts.num_processes is None and opts.num_machines is None
    assert train == ["--max_seq_length", "128", "--output_dir", "out"]


def test_parse_defaults() -> None:
    opts, train = parse(["--config_file", "c.yaml"])
    assert train == []
    # No ip/port by default: the config's own main_process_ip/port come next, then 127.0.0.1:29500.
    assert (opts.cpu, opts.machine_rank, opts.main_process_ip, opts.main_process_port, opts.dry_run) == (
        False,
        0,
        None,
        None,
        False,
    )
    assert opts.stop_grace_s == supervise.DEFAULT_GRACE_S


def test_parse_requires_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(["--cpu", "--", "--output_dir", "out"])
    assert exc.value.code == 2
    assert "--config_file" in capsys.readouterr().err


# --- build_command -----------------------------------------------------------------------------

MULTI_GPU = {"distributed_type": "MULTI_GPU", "num_processes": 8, "num_machines": 1}
DEEPSPEED = {
    "distributed_type": "DEEPSPEED",
    "num_processes": 8,
    "num_machines": 1,
    "deepspeed_config": {"deepspeed_config_file": "ds_configs/zero2.json"},
}
FSDP = {"distributed_type": "FSDP", "num_processes": 8, "num_machines": 1, "fsdp_config": {"fsdp_version": 2}}
TRAIN = ["--output_dir", "out", "--max_train_steps", "3"]


def build(cfg: dict, *argv: str) -> tuple[list[str], dict[str, str]]:
    opts, train = parse(["--config_file", "cfg.yaml", *argv, "--", *TRAIN])
    return build_command(cfg, opts, train)


@pytest.mark.parametrize("cfg", [MULTI_GPU, DEEPSPEED, FSDP], ids=lambda c: c["distributed_type"])
def test_gpu_is_accelerate_launch(cfg: dict) -> None:
    cmd, env = build(cfg)
    assert cmd == [
        "accelerate",
        "launch",
        "--config_file",
        "cfg.yaml",
        "--num_processes",
        "8",
        "--main_process_port",
        "29500",
        "-m",
        "qa_train",
        *TRAIN,
    ]
    # The launch's start, for the ranks' stop-request clock (a PREEMPT older than the run is ignored).
    assert abs(float(env.pop("QA_TRAIN_RUN_STARTED")) - time.time()) < 60
    assert env == dict(os.environ)


def test_gpu_flag_overrides_config_process_count() -> None:
    cmd, _ = build(MULTI_GPU, "--num_processes", "2")
    assert cmd[cmd.index("--num_processes") + 1] == "2"


def test_gpu_multi_machine_flags() -> None:
    cmd, _ = build(
        MULTI_GPU,
        "--num_processes",
        "16",
        "--num_machines",
        "2",
        "--machine_rank",
        "1",
        "--main_process_ip",
        "10.0.0.1",
        "--main_process_port",
        "1234",
    )
    assert cmd == [
        "accelerate",
        "launch",
        "--config_file",
        "cfg.yaml",
        "--num_processes",
        "16",
        "--num_machines",
        "2",
        "--machine_rank",
        "1",
        "--main_process_ip",
        "10.0.0.1",
        "--main_process_port",
        "1234",
        "-m",
        "qa_train",
        *TRAIN,
    ]


def test_gpu_num_machines_from_config() -> None:
    cmd, _ = build({**MULTI_GPU, "num_machines": 2, "num_processes": 16})
    assert cmd[cmd.index("--num_machines") + 1] == "2"


def test_cpu_deepspeed_is_accelerate_launch() -> None:
    cmd, env = build(DEEPSPEED, "--cpu", "--num_processes", "2")
    assert cmd == [
        "accelerate",
        "launch",
        "--config_file",
        "cfg.yaml",
        "--num_processes",
        "2",
        "--main_process_port",
        "29500",
        "-m",
        "qa_train",
        *TRAIN,
    ]
    # qa_train picks gloo itself under DeepSpeed; the environment is passed through, naming DeepSpeed's accelerator,
    # the ranks' share of the cores and the launch's start.
    assert abs(float(env.pop("QA_TRAIN_RUN_STARTED")) - time.time()) < 60
    assert env == {
        **os.environ,
        "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(cpu_threads(2))),
    }


@pytest.mark.parametrize(
    "cfg", [{"distributed_type": "NO"}, MULTI_GPU, DEEPSPEED, FSDP], ids=["single", "ddp", "deepspeed", "fsdp"]
)
def test_cpu_ranks_share_the_cores_unless_the_user_set_threads(cfg: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate launch without its own --cpu, and torchrun, give each rank 1 thread: a lone CPU rank ran on 1 of
    2 cores."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert build(cfg, "--cpu", "--num_processes", "1")[1]["OMP_NUM_THREADS"] == "8"
    assert build(cfg, "--cpu", "--num_processes", "2")[1]["OMP_NUM_THREADS"] == "4"
    assert build(cfg, "--cpu", "--num_processes", "4", "--num_machines", "2")[1]["OMP_NUM_THREADS"] == "4"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert build(cfg, "--cpu", "--num_processes", "2")[1]["OMP_NUM_THREADS"] == "3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert "OMP_NUM_THREADS" not in build(cfg)[1], "GPU ranks: accelerate's own choice"


def test_cpu_fsdp_is_accelerate_launch_on_gloo_in_fp32_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate launch turns the config's FSDP keys into the ranks' FSDP_* variables; ACCELERATE_USE_CPU gives
    a gloo group (qa_train then applies FSDP2 itself), and the config's bf16 is not forced on CPU autocast."""
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    cmd, env = build(FSDP, "--cpu", "--num_processes", "2")
    assert cmd == [
        "accelerate",
        "launch",
        "--config_file",
        "cfg.yaml",
        "--num_processes",
        "2",
        "--mixed_precision",
        "no",
        "--main_process_port",
        "29500",
        "-m",
        "qa_train",
        *TRAIN,
    ]
    assert env["ACCELERATE_USE_CPU"] == "true"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    cmd, _ = build(FSDP, "--cpu", "--num_processes", "2")
    assert flag(cmd, "--mixed_precision") == "bf16"


def test_cpu_ddp_drops_an_fsdp_switch_left_in_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """qa_train applies FSDP on CPU when ACCELERATE_USE_FSDP says so: one exported by hand earlier must not turn
    a DDP config's run into FSDP."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    _, env = build(MULTI_GPU, "--cpu", "--num_processes", "2")
    assert "ACCELERATE_USE_FSDP" not in env and env["ACCELERATE_USE_CPU"] == "true"


def test_cpu_deepspeed_multi_machine() -> None:
    cmd, _ = build(DEEPSPEED, "--cpu", "--num_processes", "4", "--num_machines", "2")
    assert cmd[:6] == ["accelerate", "launch", "--config_file", "cfg.yaml", "--num_processes", "4"]
    assert cmd[cmd.index("--num_machines") + 1] == "2"


# Every launch that forms a process group carries the port; across machines the address too.
PORT_CASES = {
    "gpu-ddp": (MULTI_GPU, ()),
    "gpu-deepspeed": (DEEPSPEED, ()),
    "gpu-fsdp": (FSDP, ()),
    "cpu-deepspeed": (DEEPSPEED, ("--cpu", "--num_processes", "2")),
    "cpu-fsdp": (FSDP, ("--cpu", "--num_processes", "2")),
    "cpu-torchrun": (MULTI_GPU, ("--cpu", "--num_processes", "2")),
    "multinode-gpu-ddp": (MULTI_GPU, ("--num_processes", "16", "--num_machines", "2", "--machine_rank", "1")),
    "multinode-gpu-deepspeed": (DEEPSPEED, ("--num_processes", "16", "--num_machines", "2", "--machine_rank", "1")),
    "multinode-gpu-fsdp": (FSDP, ("--num_processes", "16", "--num_machines", "2", "--machine_rank", "1")),
    "multinode-cpu-deepspeed": (DEEPSPEED, ("--cpu", "--num_processes", "4", "--num_machines", "2")),
    "multinode-cpu-torchrun": (MULTI_GPU, ("--cpu", "--num_processes", "4", "--num_machines", "2")),
}


def flag(cmd: list[str], *names: str) -> str | None:
    """The launcher's value for the first of `names` (accelerate's and torchrun's spellings), None when absent.
    Only the launcher's own part counts: a flag after `-m qa_train` would go to qa_train."""
    own = cmd[: cmd.index("qa_train")]
    for name in names:
        if name in own:
            return own[own.index(name) + 1]
    return None


@pytest.mark.parametrize("case", PORT_CASES)
def test_every_launch_carries_the_port(case: str) -> None:
    cfg, argv = PORT_CASES[case]
    cmd, _ = build(cfg, *argv, "--main_process_ip", "10.0.0.7", "--main_process_port", "31234")
    assert flag(cmd, "--main_process_port", "--master_port") == "31234"
    multinode = case.startswith("multinode")
    assert flag(cmd, "--main_process_ip", "--master_addr") == ("10.0.0.7" if multinode or "torchrun" in case else None)
    if multinode:
        assert flag(cmd, "--num_machines", "--nnodes") == "2"


@pytest.mark.parametrize("case", PORT_CASES)
def test_the_default_port_is_explicit(case: str) -> None:
    """Without the flag the port is still on the command line (29500), and the address on multi-node."""
    cfg, argv = PORT_CASES[case]
    cmd, _ = build(cfg, *argv)
    assert flag(cmd, "--main_process_port", "--master_port") == "29500"
    if case.startswith("multinode"):
        assert flag(cmd, "--main_process_ip", "--master_addr") == "127.0.0.1"


@pytest.mark.parametrize("case", ["gpu-deepspeed", "cpu-torchrun", "multinode-gpu-ddp"])
def test_the_config_port_and_ip_are_used_and_the_flags_win(case: str) -> None:
    cfg, argv = PORT_CASES[case]
    cfg = {**cfg, "main_process_port": 40001, "main_process_ip": "10.9.9.9"}
    cmd, _ = build(cfg, *argv)
    assert flag(cmd, "--main_process_port", "--master_port") == "40001"
    if case != "gpu-deepspeed":
        assert flag(cmd, "--main_process_ip", "--master_addr") == "10.9.9.9"
    cmd, _ = build(cfg, *argv, "--main_process_port", "40002", "--main_process_ip", "10.1.1.1")
    assert flag(cmd, "--main_process_port", "--master_port") == "40002"
    if case != "gpu-deepspeed":
        assert flag(cmd, "--main_process_ip", "--master_addr") == "10.1.1.1"


def test_port_zero_is_passed_through() -> None:
    """accelerate picks a free port for 0; the launcher must not read 0 as "not given"."""
    cmd, _ = build(DEEPSPEED, "--main_process_port", "0")
    assert flag(cmd, "--main_process_port") == "0"


def test_port_zero_is_a_free_port_under_torchrun_too_and_refused_across_machines() -> None:
    """torchrun hands its ranks port 0 as it is, and they wait forever; accelerate picks a free one for 0. On
    several machines each would pick its own."""
    cmd, _ = build(MULTI_GPU, "--cpu", "--num_processes", "2", "--main_process_port", "0")
    assert cmd[2] == "torch.distributed.run" and 0 < int(flag(cmd, "--master_port") or 0) <= 65535
    with pytest.raises(LaunchConfigError, match="^--main_process_port 0 picks a free port on each machine apart"):
        build(MULTI_GPU, "--num_processes", "4", "--num_machines", "2", "--main_process_port", "0")


@pytest.mark.parametrize("config", ["ddp", "zero2"])
def test_slurm_cpu_node_command(config: str) -> None:
    """The command slurm/train.sbatch's CPU path runs on node 1 of 2: the job's port and first host on it."""
    opts, train = parse(
        [
            "--cpu",
            "--config_file",
            f"accelerate_configs/{config}.yaml",
            "--num_machines",
            "2",
            "--num_processes",
            "2",
            "--machine_rank",
            "1",
            "--main_process_ip",
            "node-a",
            "--main_process_port",
            "29817",
            "--",
            *TRAIN,
        ]
    )
    cfg = read_config(opts.config_file, launch_dir=ROOT)
    cmd, _ = build_command(cfg, opts, train)
    assert flag(cmd, "--main_process_port", "--master_port") == "29817"
    assert flag(cmd, "--main_process_ip", "--master_addr") == "node-a"
    assert flag(cmd, "--machine_rank", "--node_rank") == "1"


def test_cpu_fsdp_offload_is_refused_naming_the_config_and_the_key() -> None:
    with pytest.raises(LaunchConfigError) as err:
        build(
            {**FSDP, "fsdp_config": {"fsdp_version": 2, "fsdp_offload_params": "true"}}, "--cpu", "--num_processes", "2"
        )
    assert str(err.value).startswith("cfg.yaml: fsdp_offload_params: true offloads to the host")


@pytest.mark.parametrize(
    "cfg",
    [{"distributed_type": "NO", "num_processes": 1}, {**MULTI_GPU, "num_processes": 1}, {}],
    ids=["single", "ddp-1", "empty"],
)
def test_cpu_one_process_is_plain_python(cfg: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    cmd, env = build(cfg, "--cpu")
    assert cmd == [sys.executable, "-m", "qa_train", *TRAIN]
    assert (env["ACCELERATE_USE_CPU"], env["ACCELERATE_MIXED_PRECISION"]) == ("true", "no")
    assert "ACCELERATE_USE_CPU" not in os.environ  # the launcher's own environment is left alone


def test_cpu_keeps_a_mixed_precision_already_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    _, env = build(MULTI_GPU, "--cpu", "--num_processes", "1")
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"


def test_cpu_ddp_many_processes_is_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    cmd, env = build(MULTI_GPU, "--cpu", "--num_processes", "2")
    assert cmd == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--node_rank",
        "0",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        "29500",
        "-m",
        "qa_train",
        *TRAIN,
    ]
    assert (env["ACCELERATE_USE_CPU"], env["ACCELERATE_MIXED_PRECISION"]) == ("true", "no")


@pytest.mark.parametrize("cfg", [DEEPSPEED, MULTI_GPU, {}], ids=["deepspeed", "ddp", "single"])
def test_cpu_tells_deepspeed_its_accelerator(cfg: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert build(cfg, "--cpu", "--num_processes", "2")[1]["DS_ACCELERATOR"] == "cpu"
    assert "DS_ACCELERATOR" not in build(cfg, "--num_processes", "2")[1]  # on GPUs DeepSpeed's own detection
    monkeypatch.setenv("DS_ACCELERATOR", "xpu")  # a user's choice is kept
    assert build(cfg, "--cpu", "--num_processes", "2")[1]["DS_ACCELERATOR"] == "xpu"


def test_cpu_ddp_many_machines_splits_processes_per_node() -> None:
    cmd, _ = build(
        MULTI_GPU,
        "--cpu",
        "--num_processes",
        "6",
        "--num_machines",
        "3",
        "--machine_rank",
        "2",
        "--main_process_ip",
        "10.1.2.3",
        "--main_process_port",
        "4000",
    )
    assert cmd == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "3",
        "--node_rank",
        "2",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "10.1.2.3",
        "--master_port",
        "4000",
        "-m",
        "qa_train",
        *TRAIN,
    ]


def test_cpu_ddp_uses_config_process_count() -> None:
    cmd, _ = build({**MULTI_GPU, "num_processes": 4}, "--cpu")
    assert cmd[cmd.index("--nproc_per_node") + 1] == "4"


@pytest.mark.parametrize(("procs", "machines"), [("3", "2"), ("1", "2")])
def test_cpu_ddp_processes_not_a_multiple_of_machines_is_refused(procs: str, machines: str) -> None:
    msg = f"--num_processes {procs} is not a multiple of --num_machines {machines}"
    with pytest.raises(LaunchConfigError, match=msg):
        build(MULTI_GPU, "--cpu", "--num_processes", procs, "--num_machines", machines)


def test_gpu_processes_not_a_multiple_of_machines_is_refused() -> None:
    with pytest.raises(LaunchConfigError, match="--num_processes 3 is not a multiple of --num_machines 2"):
        build(MULTI_GPU, "--num_processes", "3", "--num_machines", "2")


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (("--num_processes", "0"), "--num_processes must be at least 1, got 0"),  # not the config's 8
        (("--num_processes", "-2"), "--num_processes must be at least 1, got -2"),
        (("--num_processes", "2", "--num_machines", "0"), "--num_machines must be at least 1, got 0"),
        (
            ("--num_processes", "4", "--num_machines", "2", "--machine_rank", "2"),
            "--machine_rank 2 is not one of the 2",
        ),
        (("--num_processes", "4", "--num_machines", "2", "--machine_rank", "-1"), "--machine_rank -1 is not one of"),
        (("--num_processes", "2", "--machine_rank", "1"), "--machine_rank 1 is not one of the 1 machine"),
    ],
    ids=["procs-0", "procs-negative", "machines-0", "rank-past-machines", "rank-negative", "rank-on-one-machine"],
)
@pytest.mark.parametrize("device", [(), ("--cpu",)], ids=["gpu", "cpu"])
def test_impossible_counts_and_ranks_are_refused(argv: tuple[str, ...], msg: str, device: tuple[str, ...]) -> None:
    """An explicit 0 fell back to the config's count without a word, and a count below 1 or a machine rank outside
    the machines went on to torchrun (a node with a rank no other node waits for hangs at the rendezvous)."""
    with pytest.raises(LaunchConfigError, match=re.escape(msg)):
        build(MULTI_GPU, *device, *argv)


@pytest.mark.parametrize("key", ["num_processes", "num_machines"])
def test_a_config_count_below_one_is_named_as_the_configs(key: str) -> None:
    """`num_processes: 0` in the config was refused as "--num_processes must be at least 1", a flag not given."""
    with pytest.raises(LaunchConfigError, match=f"^cfg.yaml: {key} must be at least 1, got 0$"):
        build({**MULTI_GPU, key: 0})


# --- main --------------------------------------------------------------------------------------


@pytest.fixture
def no_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError(f"main executed {args}")

    monkeypatch.setattr(launch, "run_launch", refuse)
    monkeypatch.setattr(launch, "cuda_available", lambda: pytest.fail("--cpu must skip the CUDA check"))


@pytest.mark.usefixtures("no_exec")
def test_dry_run_prints_the_torchrun_command(capsys: pytest.CaptureFixture[str]) -> None:
    code = launch.main(
        [
            "--config_file",
            str(ROOT / "accelerate_configs" / "ddp.yaml"),
            "--cpu",
            "--num_processes",
            "2",
            "--dry_run",
            "--",
            "--output_dir",
            "out",
        ]
    )
    out = capsys.readouterr()
    assert code == 0
    assert out.out == (
        f"{sys.executable} -m torch.distributed.run --nnodes 1 --node_rank 0 --nproc_per_node 2 "
        "--master_addr 127.0.0.1 --master_port 29500 -m qa_train --output_dir out\n"
    )
    assert "+ " not in out.err


@pytest.mark.usefixtures("no_exec")
@pytest.mark.parametrize("on_path", [True, False])
def test_dry_run_deepspeed_falls_back_to_python_m_accelerate(
    on_path: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)  # the DeepSpeed JSON path is relative to where the launch happens
    monkeypatch.setattr(launch.shutil, "which", lambda name: f"/usr/bin/{name}" if on_path else None)
    code = launch.main(
        [
            "--config_file",
            "accelerate_configs/zero2.yaml",
            "--cpu",
            "--num_processes",
            "2",
            "--dry_run",
            "--",
            "--output_dir",
            "out",
        ]
    )
    head = "accelerate launch" if on_path else f"{sys.executable} -m accelerate.commands.launch"
    assert code == 0
    assert capsys.readouterr().out == (
        f"{head} --config_file accelerate_configs/zero2.yaml --num_processes 2 "
        "--main_process_port 29500 -m qa_train --output_dir out\n"
    )


@pytest.mark.usefixtures("no_exec")
def test_main_refuses_a_bad_config_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "zero2.yaml", DS_YAML)  # ds/zero2.json does not exist here
    code = launch.main(["--config_file", "zero2.yaml", "--cpu", "--dry_run"])
    out = capsys.readouterr()
    assert code == 2
    assert out.out == ""
    lines = out.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("qa-train launch: error: zero2.yaml: deepspeed_config_file ds/zero2.json")


@pytest.mark.usefixtures("no_exec")
@pytest.mark.parametrize(
    ("key", "value"), [("num_processes", "two"), ("num_machines", "[2]"), ("main_process_port", "port")]
)
def test_main_refuses_a_config_count_that_is_not_an_integer_with_one_line(
    key: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ddp.yaml"
    path.write_text(f"distributed_type: MULTI_GPU\n{key}: {value}\n")
    code = launch.main(["--config_file", str(path), "--cpu", "--dry_run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err  # not int()'s traceback
    assert err.startswith(f"qa-train launch: error: {path}: {key} must be an integer, got ")


@pytest.mark.usefixtures("no_exec")
def test_main_refuses_fsdp_offload_on_cpu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shipped = yaml.safe_load((ROOT / "accelerate_configs" / "fsdp.yaml").read_text())
    shipped["fsdp_config"]["fsdp_offload_params"] = True
    config = tmp_path / "fsdp_offload.yaml"
    config.write_text(yaml.safe_dump(shipped))
    code = launch.main(["--config_file", str(config), "--cpu", "--dry_run"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"qa-train launch: error: {config}: fsdp_offload_params: true offloads to the host")
    assert len(err.splitlines()) == 1


@pytest.mark.usefixtures("no_exec")
def test_main_refuses_invalid_yaml_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "bad.yaml", "a: [1, 2\nb: 3\n")
    code = launch.main(["--config_file", str(path), "--cpu", "--dry_run"])
    err = capsys.readouterr().err
    assert code == 2
    # PyYAML's message spans several lines (it quotes the offending line); the first names the file.
    assert err.splitlines()[0].startswith(f"qa-train launch: error: --config_file {path}: not valid YAML")
    assert "Traceback" not in err


def test_without_gpu_main_falls_back_to_cpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(launch, "cuda_available", lambda: False)
    monkeypatch.setattr(launch, "run_launch", lambda *a: pytest.fail("dry run executed"))
    code = launch.main(["--config_file", str(ROOT / "accelerate_configs" / "single.yaml"), "--dry_run"])
    out = capsys.readouterr()
    assert code == 0
    assert out.out == f"{sys.executable} -m qa_train\n"
    assert "no GPU visible, running on CPU processes" in out.err
