"""tools/kernel_breakdown.py on a small trace in torch.profiler's Chrome format: what a GPU profile's reader prints."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def breakdown():
    spec = importlib.util.spec_from_file_location("kernel_breakdown", ROOT / "tools" / "kernel_breakdown.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def op(name: str, ts: float, dur: float, tid: int, cat: str = "cpu_op", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def trace() -> dict:
    """One 10 ms step: a compiled forward (main thread) whose matrix product and a full garbage collection nest
    inside it, a backward on autograd's thread, three launches, a stream synchronisation and a copy to the host."""
    main, autograd = 1, 2
    events = [
        op("ProfilerStep#4", 0, 10_000, main, cat="user_annotation"),
        op("ProfilerStep#4", 50, 12_000, 7, cat="gpu_user_annotation"),  # the GPU's copy: not a second step
        op("## Call CompiledFxGraph fwd", 100, 3_000, main),
        op("aten::mm", 200, 500, main),  # inside the forward: counted with it, not again
        op("Optimizer.step#AdamW.step", 8_000, 1_000, main, cat="user_annotation"),
        op("python gc, generation 2", 1_000, 1_500, main, cat="user_annotation"),  # inside the forward
        op("## Call CompiledFxGraph bwd", 3_500, 4_000, autograd),
        op("cuLaunchKernel", 300, 10, main, cat="cuda_runtime", correlation=1),
        op("cuLaunchKernelEx", 3_600, 10, autograd, cat="cuda_runtime", correlation=2),
        op("cudaLaunchKernel", 8_100, 10, main, cat="cuda_runtime", correlation=3),
        op("cudaStreamSynchronize", 9_200, 400, main, cat="cuda_runtime", correlation=4),
        op("cudaMemcpyAsync", 9_700, 200, main, cat="cuda_runtime", correlation=5),
        op("cudaMemcpyAsync", 9_950, 20, main, cat="cuda_runtime", correlation=6),  # to the device: no wait
        op("nvjet_sm90_tst_128x160", 400, 1_000, 7, cat="kernel", correlation=1),
        op("triton_per_fused_layer_norm", 3_700, 2_000, 7, cat="kernel", correlation=2),
        op("multi_tensor_apply_kernel", 8_200, 300, 7, cat="kernel", correlation=3),
        op("Memcpy DtoH (Device -> Pageable)", 9_750, 50, 7, cat="gpu_memcpy", correlation=5),
        op("Memcpy HtoD (Pinned -> Device)", 9_960, 5, 7, cat="gpu_memcpy", correlation=6),
    ]
    return {"traceEvents": events}


def test_a_step_reads_once_with_its_host_side(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "profile"
    folder.mkdir()
    with gzip.open(folder / "host_rank0.1.pt.trace.json.gz", "wt") as f:
        json.dump(trace(), f)
    assert breakdown().main([str(folder)]) == 0
    out = capsys.readouterr().out
    assert out.count("ProfilerStep#4:") == 1, out
    assert "5 kernels" in out
    # The synchronisation and the copy into host memory block; the copy to the device does not.
    assert "host: 2 blocking call(s), 0.6 ms (cudaMemcpyAsync x1, cudaStreamSynchronize x1); 3 launches" in out
    assert "; 1 garbage collection(s), 1.5 ms" in out  # counted although an operator encloses it
    main_thread = out.split("thread 1:")[1].split("thread 2:")[0]
    assert main_thread.startswith(" 4.0 ms of the step's 10.0 in operators"), main_thread  # mm not counted again
    assert "aten::mm" not in main_thread
    assert "thread 2: 4.0 ms of the step's 10.0 in operators" in out
    assert "## Call CompiledFxGraph bwd" in out.split("thread 2:")[1]
