"""Where a profiled step's GPU time goes: the kernels of a `--profile` trace grouped by kind.

    python tools/kernel_breakdown.py RUN_DIR/profile [--top 12]

Reads the Chrome trace that `--profile` writes (torch.profiler's tensorboard handler, rank 0) and prints, per
profiled step, its wall time, the time some kernel was running (the rest is the GPU waiting for the host),
and that kernel time split by kind: matrix products, attention, inductor's fused Triton kernels, eager
element-wise and reduction kernels, the optimizer, copies. The profiler's own tables sort single kernels; a
compiled step's hundreds of Triton kernels only add up to a picture grouped like this.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

# First match wins: attention before matrix products (cuDNN's and FlashAttention's kernels name gemm parts).
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"fmha|flash|attention|sdpa|softmax", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|cutlass|xmma|cublas|sm90_|sm80_|wgmma|splitk", re.I)),
    ("optimizer", re.compile(r"multi_tensor|adam", re.I)),
    ("triton (fused)", re.compile(r"^triton_")),
    ("copy/fill", re.compile(r"memcpy|memset|copy|fill|cast", re.I)),
    ("element-wise/reduce (eager)", re.compile(r"elementwise|reduce|vectorized|unrolled|norm|dropout", re.I)),
)


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def load_trace(where: Path) -> dict:
    if not where.exists():
        sys.exit(f"kernel_breakdown: {where}: no such file or folder (did the run profile enough steps?)")
    files = sorted(where.glob("*.pt.trace.json*")) if where.is_dir() else [where]
    rank0 = [f for f in files if "rank0" in f.name] or files
    if not rank0:
        sys.exit(f"kernel_breakdown: {where}: no *.pt.trace.json (run with --profile)")
    path = rank0[-1]
    if path.suffix == ".gz":
        import gzip

        with gzip.open(path, "rt") as f:
            return json.load(f)
    with open(path) as f:
        return json.load(f)


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of intervals: overlapping kernels (several streams) count once."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a run's profile/ folder or one trace file")
    ap.add_argument("--top", type=int, default=12, help="the longest kernels to list")
    args = ap.parse_args(argv)
    events = load_trace(args.trace).get("traceEvents", [])
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        sys.exit(f"kernel_breakdown: {args.trace}: the trace holds no GPU kernels (a CPU run?)")
    # A kernel belongs to the step its launch fell in; its execution may trail the host's step marker.
    launch_ts = {
        e["args"].get("correlation"): e["ts"]
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    for name_start, name_end, name in steps:
        mine = [
            k for k in kernels if name_start <= launch_ts.get(k.get("args", {}).get("correlation"), k["ts"]) < name_end
        ]
        if not mine:
            continue
        first, last = min(k["ts"] for k in mine), max(k["ts"] + k["dur"] for k in mine)
        wall = max(name_end, last) - name_start
        busy = busy_us([(k["ts"], k["ts"] + k["dur"]) for k in mine])
        by_kind: dict[str, float] = defaultdict(float)
        for k in mine:
            by_kind[kind_of(k["name"])] += k["dur"]
        total = sum(by_kind.values())
        print(
            f"{name}: wall {wall / 1e3:.1f} ms (host step {(name_end - name_start) / 1e3:.1f} ms), GPU busy "
            f"{busy / 1e3:.1f} ms ({busy / wall:.0%}), {len(mine)} kernels, first kernel "
            f"{(first - name_start) / 1e3:.1f} ms after the step began"
        )
        for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
            print(f"    {kind:<30} {us / 1e3:8.2f} ms  {us / total:6.1%}")
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for k in kernels:
        per_name[k["name"]][0] += k["dur"]
        per_name[k["name"]][1] += 1
    print(f"longest kernels over all {len(steps)} profiled steps (total ms, calls, kind):")
    for name, (us, n) in sorted(per_name.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"    {us / 1e3:8.2f} ms {n:6d}  {kind_of(name):<14} {name[:110]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
