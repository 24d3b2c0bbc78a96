"""Run qa_train under an accelerate config on GPUs, or the same config on CPU processes.

    python -m qa_train.launch --config_file accelerate_configs/zero2.yaml [--cpu] [--num_processes 2] -- [qa_train flags]

On GPUs this is exactly `accelerate launch --config_file ... -m qa_train`. On CPU it picks the
launch that really forms a process group there: `accelerate launch --multi_gpu` without CUDA
starts N processes that each think they are alone, so DDP goes through torchrun with
ACCELERATE_USE_CPU=true (gloo); DeepSpeed configs go through accelerate launch (qa_train selects
gloo itself). accelerate does not apply FSDP on CPU, so an FSDP config is refused there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import yaml


class LaunchConfigError(ValueError):
    pass


# accelerate silently falls back to no sharding for FSDP on CPU: a "FSDP" run there would be plain
# data parallelism under a wrong name, so the launcher refuses it (and qa_train.bench skips it).
CPU_UNSUPPORTED = {"FSDP": "accelerate does not apply FSDP on CPU (it silently falls back to no sharding)"}


def cpu_refusal(cfg: dict) -> str | None:
    """Why this accelerate config cannot run on CPU processes, or None when it can."""
    return CPU_UNSUPPORTED.get(str(cfg.get("distributed_type", "NO")))


def read_config(path: str, launch_dir: Path | None = None) -> dict:
    """The accelerate YAML, refused when it cannot work; its DeepSpeed JSON path is relative to `launch_dir`
    (default: the current directory, where accelerate will resolve it)."""
    p = Path(path)
    if not p.is_file():
        raise LaunchConfigError(f"--config_file {path}: no such file (see accelerate_configs/)")
    try:
        cfg = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as err:
        raise LaunchConfigError(f"--config_file {path}: not valid YAML: {err}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("deepspeed_config") or {}, dict):
        raise LaunchConfigError(f"--config_file {path}: not an accelerate config (a YAML mapping of settings, "
                                "with deepspeed_config a mapping too); see accelerate_configs/")
    _check_deepspeed_keys(path, cfg, launch_dir or Path.cwd())
    return cfg


def _check_deepspeed_keys(path: str, cfg: dict, launch_dir: Path) -> None:
    """With a DeepSpeed JSON, accelerate refuses the same settings in the YAML (and the JSON must exist)."""
    ds = cfg.get("deepspeed_config") or {}
    ds_file = ds.get("deepspeed_config_file")
    if not ds_file:
        return
    if not (launch_dir / ds_file).is_file():
        raise LaunchConfigError(f"{path}: deepspeed_config_file {ds_file} does not exist "
                                "(paths are relative to the directory you launch from)")
    banned = {"gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
              "offload_param_device", "zero3_save_16bit_model", "mixed_precision"}
    clash = sorted(banned & set(ds))
    if clash:
        raise LaunchConfigError(f"{path}: {', '.join(clash)} must not be set next to deepspeed_config_file "
                                f"{ds_file}; put \"auto\" in the JSON and pass the qa_train flag instead")
    # YAML reads an unquoted `no` as False.
    if cfg.get("mixed_precision", "no") not in ("no", False, None):
        raise LaunchConfigError(f"{path}: mixed_precision must not be set next to deepspeed_config_file; "
                                "use qa_train's --mixed_precision (bf16 by default on GPUs)")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def build_command(cfg: dict, opts: argparse.Namespace, train_args: list[str]) -> tuple[list[str], dict[str, str]]:
    kind = str(cfg.get("distributed_type", "NO"))
    machines = opts.num_machines or int(cfg.get("num_machines", 1))
    procs = opts.num_processes or int(cfg.get("num_processes", 1))
    env = dict(os.environ)
    if procs % machines:  # accelerate would start procs // machines per node without a word
        raise LaunchConfigError(f"--num_processes {procs} is not a multiple of --num_machines {machines}")
    multi = ["--num_machines", str(machines), "--machine_rank", str(opts.machine_rank),
             "--main_process_ip", opts.main_process_ip, "--main_process_port", str(opts.main_process_port)]
    if not opts.cpu:
        cmd = ["accelerate", "launch", "--config_file", opts.config_file, "--num_processes", str(procs)]
        return cmd + (multi if machines > 1 else []) + ["-m", "qa_train", *train_args], env
    refusal = cpu_refusal(cfg)
    if refusal:
        raise LaunchConfigError(f"{opts.config_file}: {refusal}. On CPU use accelerate_configs/zero3.yaml for "
                                "fully sharded training, or run FSDP on GPUs.")
    if kind == "DEEPSPEED":
        cmd = ["accelerate", "launch", "--config_file", opts.config_file, "--num_processes", str(procs)]
        return cmd + (multi if machines > 1 else []) + ["-m", "qa_train", *train_args], env
    env["ACCELERATE_USE_CPU"] = "true"
    env.setdefault("ACCELERATE_MIXED_PRECISION", "no")
    if procs == 1 and machines == 1:
        return [sys.executable, "-m", "qa_train", *train_args], env
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(machines), "--node_rank",
           str(opts.machine_rank), "--nproc_per_node", str(procs // machines),
           "--master_addr", opts.main_process_ip, "--master_port", str(opts.main_process_port)]
    return cmd + ["-m", "qa_train", *train_args], env


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        own, train_args = argv[:cut], argv[cut + 1:]
    else:
        own, train_args = argv, []
    p = argparse.ArgumentParser(prog="python -m qa_train.launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config_file", required=True, help="An accelerate YAML from accelerate_configs/.")
    p.add_argument("--cpu", action="store_true", help="Run on CPU processes (default when no GPU is visible).")
    p.add_argument("--num_processes", type=int, default=None, help="Processes in total (all machines).")
    p.add_argument("--num_machines", type=int, default=None)
    p.add_argument("--machine_rank", type=int, default=0)
    p.add_argument("--main_process_ip", default="127.0.0.1")
    p.add_argument("--main_process_port", type=int, default=29500)
    p.add_argument("--dry_run", action="store_true", help="Print the command instead of running it.")
    opts, extra = p.parse_known_args(own)
    return opts, extra + train_args


def main(argv: list[str] | None = None) -> int:
    opts, train_args = parse(sys.argv[1:] if argv is None else argv)
    try:
        cfg = read_config(opts.config_file)
        if not opts.cpu and not cuda_available():
            print("qa_train.launch: no GPU visible, running on CPU processes", file=sys.stderr)
            opts.cpu = True
        cmd, env = build_command(cfg, opts, train_args)
    except LaunchConfigError as err:
        print(f"qa_train.launch: error: {err}", file=sys.stderr)
        return 2
    if cmd[0] == "accelerate" and shutil.which("accelerate") is None:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", *cmd[2:]]
    if opts.dry_run:
        print(" ".join(cmd))
        return 0
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    # exec keeps signals (SLURM's warning, Ctrl-C) going straight to the launcher.
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    sys.exit(main())
