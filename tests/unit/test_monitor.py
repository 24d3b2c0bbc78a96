"""qa_train.observe.monitor: per-interval figures reduced across ranks, peaks reset per interval, evaluation left out;
the run's throughput from the same counts on the same clock."""

from __future__ import annotations

import math
import time
import types

import pytest
import torch

from qa_train.observe.hostmem import GIB, HostMemory
from qa_train.observe.metrics import BatchCount, DeviceMemory
from qa_train.observe.monitor import COLUMNS, ModelCost, TrainingMetrics, interval_log, reduce_ranks


def rank(**values: float) -> dict[str, float]:
    return {
        **dict.fromkeys(COLUMNS, 0.0),
        "elapsed_s": 1.0,
        "cuda_allocated_gib": math.nan,
        "cuda_reserved_gib": math.nan,
        **values,
    }


def test_ranks_combine_mean_loss_global_throughput_and_max_memory() -> None:
    a = rank(
        loss_sum=6.0,
        micro_batches=2,
        samples=16,
        tokens=1000,
        flops=1200.0,
        elapsed_s=2.0,
        grad_norm_sum=3.0,
        norms=2,
        host_rss_gib=1.5,
    )
    b = rank(
        loss_sum=2.0,
        micro_batches=2,
        samples=16,
        tokens=800,
        flops=1200.0,
        elapsed_s=4.0,
        grad_norm_sum=3.0,
        norms=2,
        host_rss_gib=2.5,
        stop=1,
    )
    f = reduce_ranks([a, b])
    assert f.loss == 2.0  # (6 + 2) / 4 micro-batches: not the mean of the ranks' means when they differ in count
    assert f.grad_norm == 1.5  # the global norm (the same on every rank), averaged over the interval's updates
    assert f.samples_per_second == 8.0 and f.tokens_per_second == 450.0  # all ranks' work over the slowest rank
    assert f.flops_per_second_per_device == 300.0  # per device: 2,400 FLOPs over 4 s and 2 ranks
    assert f.host_rss_gib == 2.5 and math.isnan(f.peak_allocated_gib)
    assert f.stop_requested and f.bad_grad_norms == 0


def test_non_finite_norms_are_counted_and_left_out_of_the_mean() -> None:
    f = reduce_ranks([rank(grad_norm_sum=4.0, norms=3, bad_grad_norms=1, micro_batches=1)])
    assert f.grad_norm == 2.0 and f.bad_grad_norms == 1
    f = reduce_ranks([rank(norms=1, bad_grad_norms=1, micro_batches=1)])
    assert math.isnan(f.grad_norm)


def test_cpu_intervals_log_host_memory_and_gpu_intervals_add_cuda_memory_and_mfu() -> None:
    cpu = reduce_ranks([rank(loss_sum=1.0, micro_batches=1, norms=1, grad_norm_sum=0.5, host_rss_gib=1.0)])
    assert list(interval_log(cpu, ModelCost(1e9, 0.0, None), lr=1e-3, epoch=0.25)) == [
        "train/loss",
        "train/lr",
        "train/epoch",
        "train/grad_norm",
        "throughput/samples_per_second",
        "throughput/tokens_per_second",
        "memory/host_rss_gib",
    ]
    gpu = reduce_ranks(
        [
            rank(micro_batches=1, flops=4e14, cuda_allocated_gib=3.0, cuda_reserved_gib=4.0),
            rank(micro_batches=1, flops=4e14, cuda_allocated_gib=5.0, cuda_reserved_gib=6.0),
        ]
    )
    values = interval_log(gpu, ModelCost(1e9, 0.0, 989.0), lr=1e-3, epoch=1.0)
    assert values["memory/peak_allocated_gib"] == 5.0 and values["memory/peak_reserved_gib"] == 6.0
    assert values["throughput/mfu"] == round(4e14 / 1e12 / 989.0, 4)
    assert "train/grad_norm" not in values  # no update measured a norm (clipping off)


class OneRank(types.SimpleNamespace):
    """accelerator.gather of a single process is the identity."""

    def __init__(self) -> None:
        super().__init__(device=torch.device("cpu"), gather=lambda t: t)


def test_host_peak_is_per_interval_and_evaluation_is_left_out() -> None:
    rss = [1 * GIB]
    host = HostMemory(trim=False, read_rss=lambda: rss[0])
    host.reset()
    monitor = TrainingMetrics(OneRank(), DeviceMemory(torch.device("cpu")), host, ModelCost(1.0, 0.0, None), 0)
    for value in (2, 3, 2):
        rss[0] = value * GIB
        host.step()
        monitor.micro_batch(torch.tensor(1.0), BatchCount(4, 10, 12, 12.0))
    first = monitor.collect(stop_requested=False)
    assert first.host_rss_gib == 3.0 and first.loss == 1.0
    rss[0] = 2 * GIB
    host.step()
    monitor.micro_batch(torch.tensor(3.0), BatchCount(4, 10, 12, 12.0))
    with monitor.excluded("evaluation"):  # a higher peak and time that are not training's
        rss[0] = 9 * GIB
        host.step()
        time.sleep(0.2)
    second = monitor.collect(stop_requested=False)
    assert second.host_rss_gib == 2.0 and second.loss == 3.0  # the interval restarted after the first collect
    assert host.peak == 3 * GIB  # the phase peak is training's too
    assert second.samples_per_second > 4 / 0.2  # the 0.2 s of "evaluation" is not in the interval's time


def test_the_first_interval_is_timed_from_the_start_of_training() -> None:
    """The monitor is built before --eval_on_start's evaluation; timed from then, the first interval's samples/s
    counted that evaluation (measured: 3.4 samples/s at step 5 against 19 after it, with a 5 s evaluation)."""
    host = HostMemory(trim=False, read_rss=lambda: GIB)  # start() resets it: not this process's own peak
    monitor = TrainingMetrics(OneRank(), DeviceMemory(torch.device("cpu")), host, ModelCost(1.0, 0.0, None), 0)
    monitor.micro_batch(torch.tensor(7.0), BatchCount(4, 10, 12, 12.0))  # anything counted before training is forgotten
    time.sleep(0.3)  # the evaluation before training
    monitor.start()
    monitor.micro_batch(torch.tensor(1.0), BatchCount(4, 10, 12, 12.0))
    first = monitor.collect(stop_requested=False)
    assert first.loss == 1.0 and first.samples_per_second > 4 / 0.3


def test_each_micro_batch_is_counted_once_for_its_interval_and_for_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Intervals and the run read the same counts: an interval's are those since the last collect, the run's those
    since the warm-up ended."""
    from qa_train.observe import monitor as module

    now = [0.0]
    monkeypatch.setattr(module.time, "perf_counter", lambda: now[0])
    host = HostMemory(trim=False, read_rss=lambda: GIB)
    metrics = TrainingMetrics(OneRank(), DeviceMemory(torch.device("cpu")), host, ModelCost(1.0, 0.0, None), 1)
    metrics.start()
    for step, loss in enumerate((4.0, 2.0, 1.0), 1):
        metrics.micro_batch(torch.tensor(loss), BatchCount(4, 10, 12, 12.0))
        now[0] += 2.0
        metrics.optimizer_step()
        if step == 2:
            first = metrics.collect(stop_requested=False)
    last = metrics.collect(stop_requested=False)
    timed = metrics.finish()
    assert (first.loss, first.samples_per_second, first.tokens_per_second) == (3.0, 2.0, 5.0)  # 8 samples in 4 s
    assert (last.loss, last.samples_per_second) == (1.0, 2.0) and metrics.last_loss == 1.0
    assert (timed.timed_steps, timed.counted, timed.elapsed_s) == (2, BatchCount(8, 20, 24, 24.0), 4.0)


def test_one_clock_leaves_evaluation_and_checkpoints_out_of_intervals_and_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An evaluation and a checkpoint save stop the clock both readings use; the save's seconds are kept apart, and
    its memory stays in the training peak while the evaluation's does not."""
    from qa_train.observe import monitor as module

    now, rss = [0.0], [1 * GIB]
    monkeypatch.setattr(module.time, "perf_counter", lambda: now[0])
    host = HostMemory(trim=False, read_rss=lambda: rss[0])
    metrics = TrainingMetrics(OneRank(), DeviceMemory(torch.device("cpu")), host, ModelCost(1.0, 0.0, None), 0)
    metrics.start()
    for work, seconds, gib in (("evaluation", 10.0, 9), ("checkpoint", 5.0, 3), (None, 0.0, 1)):
        metrics.micro_batch(torch.tensor(1.0), BatchCount(4, 10, 12, 12.0))
        now[0] += 1.0
        metrics.optimizer_step()
        if work is not None:
            with metrics.excluded(work):
                now[0] += seconds
                rss[0] = gib * GIB
                host.step()
            rss[0] = 1 * GIB
    interval = metrics.collect(stop_requested=False)
    timed = metrics.finish()
    assert interval.samples_per_second == 4.0 and timed.elapsed_s == 3.0  # 12 samples in 3 s of steps
    assert metrics.checkpoint_s == 5.0
    assert interval.host_rss_gib == 3.0 and metrics.memory().host_rss_gib == 3.0  # the save's 3 GiB, not the 9


def test_device_memory_on_cpu_is_nan() -> None:
    memory = DeviceMemory(torch.device("cpu"))
    memory.reset()
    assert all(math.isnan(v) for v in memory.take_interval_peaks() + memory.peaks_gib())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (pytest -m gpu on a GPU machine)")
def test_cuda_peaks_reset_per_interval_but_not_overall() -> None:
    device = torch.device("cuda")
    memory = DeviceMemory(device)
    memory.reset()
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    first = memory.take_interval_peaks()
    del big
    torch.cuda.empty_cache()
    # A reset restarts the peak at what is allocated then: the second interval began with `big` alive.
    second = memory.take_interval_peaks()
    third = memory.take_interval_peaks()
    assert first[0] >= 0.25 and second[0] >= 0.25 > third[0] and memory.peaks_gib()[0] >= 0.25
