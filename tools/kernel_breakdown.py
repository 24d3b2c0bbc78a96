"""Where a profiled step's GPU time goes: the kernels of a `--profile` trace grouped by kind.

    python tools/kernel_breakdown.py RUN_DIR/profile [--top 12]

Reads the Chrome trace that `--profile` writes (torch.profiler's tensorboard handler, rank 0) and prints, per
profiled step, its wall time, the time some kernel was running (the rest is the GPU waiting for the host),
and that kernel time split by kind: matrix products, attention, inductor's fused Triton kernels, eager
element-wise and reduction kernels, the optimizer, copies. The profiler's own tables sort single kernels; a
compiled step's hundreds of Triton kernels only add up to a picture grouped like this.

Then the host's side of the step, which decides a step whose GPU waits: the calls that block the host on the
GPU (synchronisations, copies to host memory), the time spent launching, and the outermost operators of each
thread by time (the backward pass runs on autograd's own thread).
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


# Runtime calls that hold the host until the GPU catches up; a copy to the host waits for its stream.
BLOCKING = re.compile(r"^cuda(Stream|Device|Event)Synchronize$|^cudaMemcpy$")
LAUNCH = re.compile(r"^(cuLaunchKernel|cudaLaunchKernel)")


def outermost(events: list[dict]) -> list[dict]:
    """The events of one thread that no other of them encloses."""
    top: list[dict] = []
    end = float("-inf")
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            top.append(e)
            end = e["ts"] + e["dur"]
    return top


def host_lines(events: list[dict], start: float, end: float, to_host: set) -> list[str]:
    """The host's side of one step: blocking calls, launches, and each thread's outermost operators by time."""
    inside = [e for e in events if e.get("ph") == "X" and start <= e["ts"] < end]
    runtime = [e for e in inside if e.get("cat") == "cuda_runtime"]
    blocking = [e for e in runtime if BLOCKING.match(e["name"]) or e.get("args", {}).get("correlation") in to_host]
    launches = [e for e in runtime if LAUNCH.match(e["name"])]
    # qa_train's --profile marks Python's garbage collections: a full one stalls the host with no operator running.
    gc_ranges = [e for e in inside if e["name"].startswith("python gc")]
    names: dict[str, int] = defaultdict(int)
    for e in blocking:
        names[e["name"]] += 1
    said = ", ".join(f"{n} x{c}" for n, c in sorted(names.items()))
    lines = [
        f"    host: {len(blocking)} blocking call(s), {sum(e['dur'] for e in blocking) / 1e3:.1f} ms"
        + (f" ({said})" if said else "")
        + f"; {len(launches)} launches, {sum(e['dur'] for e in launches) / 1e3:.1f} ms"
        + f"; {len(gc_ranges)} garbage collection(s), {sum(e['dur'] for e in gc_ranges) / 1e3:.1f} ms"
    ]
    by_thread: dict[object, list[dict]] = defaultdict(list)
    for e in inside:
        if e.get("cat") in ("cpu_op", "user_annotation", "python_function") and not e["name"].startswith(
            "ProfilerStep#"
        ):
            by_thread[e.get("tid")].append(e)
    for tid, ops in sorted(by_thread.items(), key=lambda kv: -sum(e["dur"] for e in outermost(kv[1]))):
        per_name: dict[str, float] = defaultdict(float)
        for e in outermost(ops):
            per_name[e["name"][:60]] += e["dur"]
        busy = sum(per_name.values())
        top = sorted(per_name.items(), key=lambda kv: -kv[1])[:5]
        lines.append(
            f"    thread {tid}: {busy / 1e3:.1f} ms of the step's {(end - start) / 1e3:.1f} in operators, most in:"
        )
        lines += [f"        {us / 1e3:8.2f} ms  {name}" for name, us in top]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a run's profile/ folder or one trace file")
    ap.add_argument("--top", type=int, default=12, help="the longest kernels to list")
    args = ap.parse_args(argv)
    events = load_trace(args.trace).get("traceEvents", [])
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"])
        for e in events
        # The GPU's copy of each step marker (gpu_user_annotation) spans its kernels, not its launches.
        if e.get("ph") == "X"
        and e.get("cat") != "gpu_user_annotation"
        and str(e.get("name", "")).startswith("ProfilerStep#")
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
    to_host = {  # correlations of copies into host memory: their launch call waits for the stream
        k.get("args", {}).get("correlation")
        for k in kernels
        if k.get("cat") == "gpu_memcpy" and re.search(r"DtoH|Device -> (Pageable|Pinned)", k["name"])
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
        print("\n".join(host_lines(events, name_start, name_end, to_host)))
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
