"""Run qa_train under an accelerate config on GPUs, or the same config on CPU processes.

    qa-train launch --config_file accelerate_configs/zero2.yaml [--cpu] [--num_processes 2] -- [qa_train flags]

On GPUs this is exactly `accelerate launch --config_file ... -m qa_train`. On CPU it picks the
launch that really forms a process group there: `accelerate launch --multi_gpu` without CUDA
starts N processes that each think they are alone, so DDP goes through torchrun with
ACCELERATE_USE_CPU=true (gloo); DeepSpeed and FSDP configs go through accelerate launch (qa_train selects
gloo, and applies the FSDP2 sharding that accelerate leaves out on CPU).

Every launch gets --main_process_port (and, across machines, --main_process_ip): two jobs on one
node must not both take accelerate's default 29500.

The launch runs as a child in a session of its own, so stop signals reach the ranks only through
this launcher: SIGTERM, SIGUSR1 and Ctrl-C ask every rank to checkpoint and stop (qa_train's own
handler), a second Ctrl-C or SIGTERM, or --stop_grace_s without an exit, kills them, and no rank
outlives the launcher. Its exit code is the launch's: that of the rank torch names as the root cause, where
torchrun would report only 1 (qa_train.strategy.agent, which also says that failure in one line instead of
torchrun's traceback).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import socket
import sys
import time
from collections.abc import Collection
from pathlib import Path

import yaml

from qa_train.config.parser import OneLineParser
from qa_train.core.errors import did_you_mean, one_line, refusal_text
from qa_train.core.preemption import RUN_STARTED_ENV
from qa_train.strategy.checks import cpu_threads
from qa_train.strategy.supervise import DEFAULT_GRACE_S, agent_command, run_launch

DEFAULT_IP, DEFAULT_PORT = "127.0.0.1", 29500  # accelerate's defaults


class LaunchConfigError(ValueError):
    pass


def cpu_refusal(cfg: dict) -> str | None:
    """Why this accelerate config cannot run on CPU processes, or None when it can."""
    # accelerate launch reads fsdp_config's keys with an fsdp_ prefix, given or not.
    fsdp = {(k if str(k).startswith("fsdp_") else f"fsdp_{k}"): v for k, v in (cfg.get("fsdp_config") or {}).items()}
    if str(cfg.get("distributed_type")) != "FSDP":
        return None
    # FSDP1 (accelerate's default without fsdp_version) syncs module states through an accelerator device.
    if str(fsdp.get("fsdp_version", 1)) != "2":
        return "FSDP on CPU processes is FSDP2: set fsdp_version: 2 under fsdp_config"
    # FSDP2's CPUOffloadPolicy asks torch for an accelerator device, which a CPU-only machine does not have.
    if str(fsdp.get("fsdp_offload_params", False)).lower() == "true":
        return (
            "fsdp_offload_params: true offloads to the host from an accelerator, and CPU processes have none; "
            "set it false"
        )
    return None


def read_config(path: str, launch_dir: Path | None = None, *, as_accelerate: bool = True) -> dict:
    """The accelerate YAML, refused when it cannot work; its DeepSpeed JSON path is relative to `launch_dir`
    (default: the current directory, where accelerate will resolve it). `as_accelerate=False` leaves out the checks
    that import accelerate (and so torch): the launch agent runs them before it starts the ranks."""
    p = Path(path)
    if not p.is_file():
        raise LaunchConfigError(f"--config_file {path}: no such file (see accelerate_configs/)")
    try:
        cfg = yaml.safe_load(p.read_text())
    except UnicodeDecodeError as err:
        raise LaunchConfigError(
            f"--config_file {path}: not UTF-8 text (byte {err.start}), so not an accelerate config"
        ) from None
    except yaml.YAMLError as err:  # its text spans lines: the mark, then the line with a caret under it
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or " ".join(str(err).split())
        raise LaunchConfigError(f"--config_file {path}: not valid YAML: {where}{problem}") from None
    if cfg is None:  # accelerate's own loader fails on it with a TypeError
        raise LaunchConfigError(f"--config_file {path}: empty; an accelerate config names its distributed_type")
    if not isinstance(cfg, dict) or not all(isinstance(cfg.get(k) or {}, dict) for k in STRATEGY_SECTIONS):
        raise LaunchConfigError(
            f"--config_file {path}: not an accelerate config (a YAML mapping of settings, "
            "with deepspeed_config and fsdp_config mappings too); see accelerate_configs/"
        )
    if as_accelerate:
        check_as_accelerate_does(path, cfg)
    _check_deepspeed_keys(path, cfg, launch_dir or Path.cwd())
    return cfg


# The config's sections whose keys `accelerate launch` copies onto its own flags (fsdp_config's with an fsdp_
# prefix where they lack one); a key that is none of its flags is dropped without a word.
STRATEGY_SECTIONS = {"deepspeed_config": "", "fsdp_config": "fsdp_"}


def check_as_accelerate_does(path: str, cfg: dict) -> None:
    """Refuse what accelerate's own loader refuses (its ClusterConfig: known keys, a distributed_type and
    compute_environment it has), and strategy-section keys that `accelerate launch` would drop, in one line naming
    the key. The DDP path on CPU (torchrun) never hands the file to accelerate: a misspelled DEEPSPEED ran DDP."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import ComputeEnvironment, DistributedType, PrecisionType

    where = f"--config_file {path}"
    settings = ClusterConfig.process_config(dict(cfg)) if "distributed_type" in cfg else cfg  # legacy keys renamed
    unknown = sorted(set(settings) - set(ClusterConfig.__dataclass_fields__))
    if unknown:
        found = _unknown(unknown[0], ClusterConfig.__dataclass_fields__)
        raise LaunchConfigError(f"{where}: {found}; accelerate's config loader refuses it")
    for key, kind in (("distributed_type", DistributedType), ("compute_environment", ComputeEnvironment)):
        value = cfg.get(key, "LOCAL_MACHINE" if key == "compute_environment" else None)
        choices = [e.value for e in kind]
        if value is None:
            raise LaunchConfigError(f"{where}: no {key}; accelerate needs one of {', '.join(choices)}")
        if str(value) not in choices:
            hint = did_you_mean(str(value), choices)
            raise LaunchConfigError(f"{where}: {key} {value!r} is not one of accelerate's{hint}: {', '.join(choices)}")
    precision = cfg.get("mixed_precision")
    # YAML reads an unquoted `no` as False; accelerate lowercases the rest, and otherwise refuses it only on GPUs.
    if precision not in (None, False) and str(precision).lower() not in PrecisionType.list():
        hint = did_you_mean(str(precision).lower(), PrecisionType.list())
        raise LaunchConfigError(
            f"{where}: mixed_precision {precision!r} is not one of accelerate's{hint}: {', '.join(PrecisionType.list())}"
        )
    if str(cfg.get("compute_environment", "LOCAL_MACHINE")) != "LOCAL_MACHINE":
        raise LaunchConfigError(
            f"{where}: compute_environment {cfg['compute_environment']}: only LOCAL_MACHINE runs here"
        )
    flags = {action.dest for action in launch_command_parser()._actions}
    for section, prefix in STRATEGY_SECTIONS.items():
        for key in cfg.get(section) or {}:
            if (key if str(key).startswith(prefix) else prefix + str(key)) not in flags:
                known = [f for f in flags if f.startswith(prefix or ("deepspeed", "zero", "offload"))]
                raise LaunchConfigError(
                    f"{where}: {section}: {_unknown(str(key), known)}, so accelerate launch would ignore it"
                )
    try:
        ClusterConfig(**settings)  # whatever else accelerate's loader checks
    except (TypeError, ValueError) as err:
        raise LaunchConfigError(f"{where}: accelerate refuses it: {one_line(err)}") from None


def _unknown(key: str, known) -> str:
    return f"unknown key {key!r}{did_you_mean(key, known)}"


def _check_deepspeed_keys(path: str, cfg: dict, launch_dir: Path) -> None:
    """With a DeepSpeed JSON, accelerate refuses the same settings in the YAML (and the JSON must exist)."""
    ds = cfg.get("deepspeed_config") or {}
    ds_file = ds.get("deepspeed_config_file")
    if not ds_file:
        return
    if not (launch_dir / ds_file).is_file():
        raise LaunchConfigError(
            f"{path}: deepspeed_config_file {ds_file} does not exist "
            "(paths are relative to the directory you launch from)"
        )
    banned = {
        "gradient_accumulation_steps",
        "gradient_clipping",
        "zero_stage",
        "offload_optimizer_device",
        "offload_param_device",
        "zero3_save_16bit_model",
        "mixed_precision",
    }
    clash = sorted(banned & set(ds))
    if clash:
        raise LaunchConfigError(
            f"{path}: {', '.join(clash)} must not be set next to deepspeed_config_file "
            f'{ds_file}; put "auto" in the JSON and pass the qa_train flag instead'
        )
    # YAML reads an unquoted `no` as False.
    if cfg.get("mixed_precision", "no") not in ("no", False, None):
        raise LaunchConfigError(
            f"{path}: mixed_precision must not be set next to deepspeed_config_file; "
            "use qa_train's --mixed_precision (bf16 by default on GPUs)"
        )


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def build_command(cfg: dict, opts: argparse.Namespace, train_args: list[str]) -> tuple[list[str], dict[str, str]]:
    kind = str(cfg.get("distributed_type", "NO"))
    # `is None`, not `or`: an explicit 0 is a mistake to refuse, not a request for the config's count.
    machines = opts.num_machines if opts.num_machines is not None else _config_int(cfg, "num_machines", 1, opts)
    procs = opts.num_processes if opts.num_processes is not None else _config_int(cfg, "num_processes", 1, opts)
    env = dict(os.environ)
    env.setdefault(RUN_STARTED_ENV, f"{time.time():.3f}")  # a stop request made while the ranks start is theirs
    for key, count in (("num_processes", procs), ("num_machines", machines)):
        if count < 1:  # named where it was given: the flag, else the config's key
            where = f"--{key}" if getattr(opts, key) is not None else f"{opts.config_file}: {key}"
            raise LaunchConfigError(f"{where} must be at least 1, got {count}")
    if not 0 <= opts.machine_rank < machines:  # the other machines would wait for this one at the rendezvous
        raise LaunchConfigError(
            f"--machine_rank {opts.machine_rank} is not one of the {machines} machine(s): give 0 to {machines - 1}"
        )
    if procs % machines:  # accelerate would start procs // machines per node without a word
        raise LaunchConfigError(f"--num_processes {procs} is not a multiple of --num_machines {machines}")
    refusal = cpu_refusal(cfg) if opts.cpu else None
    if refusal:
        raise LaunchConfigError(f"{opts.config_file}: {refusal}")
    ip, port = main_process(cfg, opts)
    if port == 0 and machines > 1:
        raise LaunchConfigError(
            "--main_process_port 0 picks a free port on each machine apart, where the other machines could not find "
            "rank 0's: give every machine the same port"
        )
    if opts.cpu:  # DeepSpeed otherwise guesses its accelerator, and warns once per rank that it chose the CPU
        env.setdefault("DS_ACCELERATOR", "cpu")
        # torchrun gives several ranks 1 thread each whatever the cores, accelerate launch without its own --cpu every
        # rank, a lone one too (docs/benchmarks/2026-11-25-cpu-vs-hf-example.md); a setting of the user's is kept.
        env.setdefault("OMP_NUM_THREADS", str(cpu_threads(procs // machines)))
    if opts.cpu and kind != "DEEPSPEED":  # ranks that form a gloo group on CPU, in fp32 unless asked
        env["ACCELERATE_USE_CPU"] = "true"
        env.setdefault("ACCELERATE_MIXED_PRECISION", "no")
    if not opts.cpu or kind in ("DEEPSPEED", "FSDP"):
        cmd = ["accelerate", "launch", "--config_file", opts.config_file, "--num_processes", str(procs)]
        if opts.cpu and kind == "FSDP":
            # accelerate launch turns the config's FSDP keys into the ranks' FSDP_* variables, and would hand them
            # the config's bf16 (autocast on CPU) over the environment's choice.
            cmd += ["--mixed_precision", env["ACCELERATE_MIXED_PRECISION"]]
        if machines > 1:
            cmd += ["--num_machines", str(machines), "--machine_rank", str(opts.machine_rank), "--main_process_ip", ip]
        # Always the port: on one node too, two jobs left on accelerate's default 29500 would collide.
        return cmd + ["--main_process_port", str(port), "-m", "qa_train", *train_args], env
    env.pop("ACCELERATE_USE_FSDP", None)  # one left in the shell would turn this DDP run into FSDP on CPU
    if procs == 1 and machines == 1:
        return [sys.executable, "-m", "qa_train", *train_args], env  # no process group, so no port
    if port == 0:  # accelerate launch picks a free port for 0; torchrun would hand its ranks port 0 and wait forever
        port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(machines),
        "--node_rank",
        str(opts.machine_rank),
        "--nproc_per_node",
        str(procs // machines),
        "--master_addr",
        ip,
        "--master_port",
        str(port),
    ]
    return cmd + ["-m", "qa_train", *train_args], env


def free_port(taken: Collection[int] = ()) -> int:
    """A port free on this machine now (the kernel's pick, as accelerate's own for port 0), and not in `taken`."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port


def main_process(cfg: dict, opts: argparse.Namespace) -> tuple[str, int]:
    """Rank 0's address and port: the flags, else the config's own keys, else accelerate's defaults."""
    ip = opts.main_process_ip or cfg.get("main_process_ip") or DEFAULT_IP
    if opts.main_process_port is not None:
        return str(ip), opts.main_process_port
    return str(ip), _config_int(cfg, "main_process_port", DEFAULT_PORT, opts)


def _config_int(cfg: dict, key: str, default: int, opts: argparse.Namespace) -> int:
    """An integer setting of the config (absent or null: `default`), refused in one line when it is not one."""
    value = cfg.get(key)
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise LaunchConfigError(f"{opts.config_file}: {key} must be an integer, got {value!r}") from None


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        own, train_args = argv[:cut], argv[cut + 1 :]
    else:
        own, train_args = argv, []
    p = OneLineParser(prog="qa-train launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config_file", required=True, help="An accelerate YAML from accelerate_configs/.")
    p.add_argument("--cpu", action="store_true", help="Run on CPU processes (default when no GPU is visible).")
    p.add_argument("--num_processes", type=int, default=None, help="Processes in total (all machines).")
    p.add_argument("--num_machines", type=int, default=None)
    p.add_argument("--machine_rank", type=int, default=0)
    p.add_argument(
        "--main_process_ip",
        default=None,
        help=f"Rank 0's address (default: the config's main_process_ip, else {DEFAULT_IP}).",
    )
    p.add_argument(
        "--main_process_port",
        type=int,
        default=None,
        help=f"Rank 0's port (default: the config's main_process_port, else {DEFAULT_PORT}). "
        "Give each job on a node its own.",
    )
    p.add_argument(
        "--stop_grace_s",
        type=float,
        default=DEFAULT_GRACE_S,
        help="After SIGTERM or Ctrl-C, how long the ranks get to checkpoint and exit before they are "
        "killed (default %(default)g).",
    )
    p.add_argument("--dry_run", action="store_true", help="Print the command instead of running it.")
    opts, extra = p.parse_known_args(own)
    problem = check_options(opts)
    if problem:
        p.error(problem)
    return opts, extra + train_args


def check_options(opts: argparse.Namespace) -> str | None:
    """The first of launch's own flags that cannot work, as one line, or None."""
    port = opts.main_process_port
    # 0 is accelerate's "pick a free port" (build_command does the same for torchrun, which would wait on port 0).
    if port is not None and not 0 <= port <= 65535:
        return f"--main_process_port: must be a port from 1 to 65535 (or 0: any free one), got {port}"
    if not (math.isfinite(opts.stop_grace_s) and opts.stop_grace_s >= 0):  # nan passes `< 0`; inf never kills
        return f"--stop_grace_s: must be a finite number of seconds, 0 or more, got {opts.stop_grace_s:g}"
    return None


def main(argv: list[str] | None = None) -> int:
    opts, train_args = parse(sys.argv[1:] if argv is None else argv)
    try:
        cfg = read_config(opts.config_file, as_accelerate=False)
        if not opts.cpu and not cuda_available():
            print("qa-train launch: no GPU visible, running on CPU processes", file=sys.stderr)
            opts.cpu = True
        try:
            cmd, env = build_command(cfg, opts, train_args)
        except LaunchConfigError:
            check_as_accelerate_does(opts.config_file, cfg)  # its refusal names the cause (a misspelled key) first
            raise
        if cmd[0] == "accelerate" and shutil.which("accelerate") is None:
            cmd = [sys.executable, "-m", "accelerate.commands.launch", *cmd[2:]]
        # This process only supervises: where an agent starts the ranks, accelerate's checks (and their imports of
        # accelerate and torch, seconds of the launch's start) are the agent's, which imports both anyway; it also
        # says the command once they pass, so a refused config is its one error line.
        launch = agent_command(cmd, opts.config_file, echo=True)
        by_agent = launch != cmd  # the agent then checks the config and says the command
        if not by_agent or opts.dry_run:
            check_as_accelerate_does(opts.config_file, cfg)
    except (LaunchConfigError, OSError) as err:
        print(f"qa-train launch: error: {refusal_text(err)}", file=sys.stderr)
        return 2
    if opts.dry_run:
        print(" ".join(cmd))
        return 0
    if not by_agent:
        print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return run_launch(launch, env, opts.stop_grace_s)


# --- running the launch ------------------------------------------------------------------------
