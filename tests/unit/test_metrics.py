"""Figures from counts: throughput over ranks, MFU, FLOPs per token and the metrics.json schema."""

from __future__ import annotations

import dataclasses
import math
import types

import pytest
import torch

from qa_train.model.modeling import flop_coefficients
from qa_train.observe.hostmem import GIB, HostMemory
from qa_train.observe.metrics import (
    BatchCount,
    DeviceMemory,
    RankFigures,
    Throughput,
    TrainMemory,
    TrainSummary,
    peak_tflops,
    summarize,
)
from qa_train.observe.monitor import ModelCost, TrainingMetrics
from qa_train.observe.schema import MetricsFileError, PerRank, RunMetrics, Scores, TrainFigures
from qa_train.observe.startup import Startup

NAN = float("nan")


def rank(
    samples: float,
    elapsed: float,
    rss: float,
    cuda: float = NAN,
    loss: float = 1.0,
    compile_s: float = NAN,
    graphs: float = NAN,
    cache: tuple[float, float] = (NAN, NAN),
) -> RankFigures:
    return RankFigures(
        samples=samples,
        tokens=samples * 100,
        padded_tokens=samples * 128,
        flops=samples * 128 * 5e8,
        elapsed_s=elapsed,
        timed_steps=10,
        cuda_allocated_gib=cuda,
        cuda_reserved_gib=cuda * 1.25,
        train_rss_gib=rss,
        baseline_rss_gib=rss - 0.25,
        lifetime_rss_gib=rss + 0.5,
        last_loss=loss,
        compile_s=compile_s,
        compiled_graphs=graphs,
        compile_cache_hits=cache[0],
        compile_cache_misses=cache[1],
    )


def test_throughput_sums_ranks_over_the_slowest_and_memory_stays_per_rank() -> None:
    fig = summarize([rank(100, 10.0, 1.0), rank(100, 12.5, 1.5)], peak=None, on_cuda=False)
    assert fig.train_samples_per_second == 16.0  # 200 samples / the slower rank's 12.5 s
    assert fig.train_tokens_per_second == 1600.0 and fig.train_padded_tokens_per_second == 2048.0
    assert fig.train_step_time_s_mean == 1.25 and fig.timed_steps == 10
    assert fig.tflops_per_device == round(2048 * 5e8 / 2 / 1e12, 3) and fig.mfu is None
    assert fig.peak_memory_source == "host_rss_during_training"
    assert fig.peak_memory_gb == PerRank([1.0, 1.5], 1.5, 1.25) == fig.train_host_rss_gb
    assert fig.peak_host_rss_gb == PerRank([1.5, 2.0], 2.0, 1.75)
    assert fig.host_rss_baseline_gb == PerRank([0.75, 1.25], 1.25, 1.0)
    assert fig.peak_memory_reserved_gb == PerRank()  # NaN on CPU: no CUDA figures at all


def test_on_cuda_memory_is_the_allocator_peak_and_mfu_is_against_the_peak() -> None:
    fig = summarize([rank(1000, 1.0, 3.0, cuda=20.0), rank(1000, 1.0, 3.2, cuda=22.0)], peak=989.0, on_cuda=True)
    achieved = 2000 * 128 * 5e8 / 2 / 1e12
    assert fig.tflops_per_device == round(achieved, 3) and fig.mfu == round(achieved / 989.0, 4)
    assert fig.peak_memory_source == "cuda_max_allocated"
    assert fig.peak_memory_gb.per_rank == [20.0, 22.0] and fig.peak_memory_reserved_gb.max == 27.5
    assert fig.train_host_rss_gb.max == 3.2


def test_a_ranks_figures_are_what_it_trained_field_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    from qa_train.observe import metrics

    monkeypatch.setattr(metrics, "lifetime_rss_gib", lambda: 3.5)  # read when the figures are made, after evaluation
    trained = TrainSummary(
        finished=True,
        steps=12,
        runtime_s=9.0,
        checkpoint_s=1.0,
        last_loss=0.25,
        throughput=Throughput(BatchCount(16, 1400, 2048, 2e9), elapsed_s=4.0, timed_steps=10),
        memory=TrainMemory(cuda_allocated_gib=NAN, cuda_reserved_gib=NAN, host_rss_gib=1.5, host_baseline_gib=1.0),
        compile_s=12.5,
        compiled_graphs=2.0,
    )
    mine = RankFigures.measured(trained, Startup(math.nan, math.nan, 1.0))
    assert (mine.samples, mine.tokens, mine.padded_tokens, mine.flops) == (16, 1400, 2048, 2e9)
    assert (mine.elapsed_s, mine.timed_steps, mine.last_loss) == (4.0, 10, 0.25)
    assert (mine.train_rss_gib, mine.baseline_rss_gib, mine.lifetime_rss_gib) == (1.5, 1.0, 3.5)
    assert math.isnan(mine.cuda_allocated_gib) and (mine.compile_s, mine.compiled_graphs) == (12.5, 2.0)
    assert math.isnan(mine.startup_launch_s) and math.isnan(mine.startup_process_s) and mine.startup_build_s == 1.0
    fig = summarize([mine], None, False)
    assert fig.train_samples_per_second == 4.0 and fig.train_step_time_s_mean == 0.4
    assert fig.host_rss_baseline_gb.max == 1.0 and fig.peak_host_rss_gb.max == 3.5 and fig.compiled_graphs == 2


def test_rank_figures_travel_as_rows_by_field_name() -> None:
    mine = dataclasses.replace(
        rank(7, 2.0, 0.5, loss=0.25, compile_s=12.5, graphs=2), cpu_count=16, startup_process_s=2.5, startup_build_s=4.0
    )
    row = mine.as_row()
    assert len(row) == len(dataclasses.fields(RankFigures)) and row[0] == 7.0 and row[-1] == 4.0
    back = RankFigures.from_row(row)
    assert back.last_loss == 0.25 and back.train_rss_gib == 0.5 and math.isnan(back.cuda_allocated_gib)
    assert back.baseline_rss_gib == 0.25 and (back.compile_s, back.compiled_graphs) == (12.5, 2.0)
    assert back.cpu_count == 16 and math.isnan(back.own_cpu_cores)
    assert math.isnan(back.startup.launch_s) and (back.startup.process_s, back.startup.build_s) == (2.5, 4.0)


@pytest.mark.parametrize(
    ("name", "precision", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.0),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H100 NVL", "fp16", 835.0),
        ("NVIDIA H200", "bf16", 989.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A10G", "bf16", 125.0),
        ("NVIDIA L40S", "bf16", 362.0),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA H100 80GB HBM3", "no", None),
        ("cpu", "bf16", None),
        ("Some Future GPU", "bf16", None),
    ],
)
def test_peak_tflops_per_device_and_precision(name: str, precision: str, peak: float | None) -> None:
    assert peak_tflops(name, precision) == peak


@pytest.mark.parametrize("width", [16, 48, 120])
def test_a_batchs_flops_at_its_padded_width_match_torch_flop_counter(width: int) -> None:
    """The formula counts exactly the matmuls torch runs for one training step (forward + backward), at whatever
    width dynamic padding gave the batch: attention's share follows the width, not --max_seq_length."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import BertConfig, BertForQuestionAnswering

    config = BertConfig(
        vocab_size=500,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=160,
        max_position_embeddings=128,
    )
    model = BertForQuestionAnswering._from_config(config, attn_implementation="eager")
    batch = 2
    ids = torch.randint(0, 500, (batch, width))
    labels = torch.zeros(batch, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, start_positions=labels, end_positions=labels).loss.backward()
    cost = ModelCost(*flop_coefficients(config), peak_tflops=None)
    assert cost.batch_flops(batch * width, width) == counter.get_total_flops()


def test_flops_per_token_bert_base_by_hand() -> None:
    from transformers import BertConfig

    h, layers, inter, seq = 768, 12, 3072, 384
    matmul_params = layers * (4 * h * h + 2 * h * inter) + 2 * h  # 84,936,192
    cost = ModelCost(*flop_coefficients(BertConfig()), peak_tflops=None)
    assert cost.batch_flops(seq, seq) / seq == 6 * matmul_params + 12 * layers * h * seq == 552_084_480


def test_schema_reads_what_it_writes_and_names_what_is_missing(tmp_path) -> None:
    m = RunMetrics(
        exact_match=80.0,
        f1=88.0,
        peak_memory_gb=PerRank([1.0], 1.0, 1.0),
        world_size=1,
        strategy="single",
        train_samples_per_second=10.0,
        args={"run_name": "r"},
    )
    payload = m.to_json()
    assert list(payload)[:2] == ["exact_match", "f1"]
    assert set(payload) == {f.name for f in dataclasses.fields(RunMetrics)}
    assert {f.name for f in dataclasses.fields(TrainFigures)} | {f.name for f in dataclasses.fields(Scores)} < set(
        payload
    )
    assert RunMetrics.from_json({**payload, "from_a_newer_version": 1}) == m
    with pytest.raises(MetricsFileError, match="some/run: metrics.json lacks strategy"):
        RunMetrics.from_json({"world_size": 1, "train_samples_per_second": 1.0}, "some/run")
    for torn in (b"{broken", b"\xff\xfe{}", b"[" * 100_000):  # not UTF-8 and deep nesting escaped as tracebacks
        (tmp_path / "metrics.json").write_bytes(torn)
        with pytest.raises(MetricsFileError, match="metrics.json is not valid JSON"):
            RunMetrics.read(tmp_path)


def test_every_schema_field_is_documented() -> None:
    """A field without its docstring is a key a reader of metrics.json cannot look up."""
    import ast
    import inspect

    from qa_train.observe import schema

    tree = ast.parse(inspect.getsource(schema))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in ("Scores", "TrainFigures", "RunMetrics"):
            body = node.body
            for i, item in enumerate(body):
                if isinstance(item, ast.AnnAssign):
                    doc = body[i + 1] if i + 1 < len(body) else None
                    assert isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant), (
                        f"{node.name}.{item.target.id} has no docstring"
                    )


def training(warmup_steps: int) -> TrainingMetrics:
    """The loop's metrics on one CPU rank, host memory scripted (no reading of this process's own)."""
    one_rank = types.SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t)
    host = HostMemory(trim=False, read_rss=lambda: GIB)
    return TrainingMetrics(one_rank, DeviceMemory(torch.device("cpu")), host, ModelCost(1.0, 0.0, None), warmup_steps)


BATCH = BatchCount(8, 700, 1024, 1e9)


def test_a_run_no_longer_than_its_warm_up_is_timed_whole() -> None:
    """Two steps with a warm-up of two used to report 0 samples/s: nothing was counted after the warm-up."""
    meter = training(warmup_steps=2)
    meter.start()
    for _ in range(2):
        meter.micro_batch(torch.tensor(1.0), BATCH)
        meter.optimizer_step()
    timed = meter.finish()
    assert (timed.timed_steps, timed.counted) == (2, BatchCount(16, 1400, 2048, 2e9))
    longer = training(warmup_steps=1)
    for _ in range(3):
        longer.micro_batch(torch.tensor(1.0), BATCH)
        longer.optimizer_step()
    timed = longer.finish()
    assert (timed.timed_steps, timed.counted.samples) == (2, 16), "past the warm-up only the timed steps count"


def test_no_timed_step_means_no_throughput_not_zero() -> None:
    rank = RankFigures(0, 0, 0, 0.0, 1e-9, 0, math.nan, math.nan, 0.5, 0.3, 0.6, math.nan, math.nan, math.nan)
    figures = summarize([rank], None, False)
    assert figures.train_samples_per_second is None and figures.tflops_per_device is None
    assert figures.train_step_time_s_mean is None and figures.timed_steps == 0


@pytest.mark.parametrize(("warmup", "steps"), [(0, 4), (2, 2)])
def test_evaluation_during_training_is_left_out_of_the_clock_with_any_warm_up(
    warmup: int, steps: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --throughput_warmup_steps 0, or a run no longer than its warm-up, the clock runs from the first step;
    evaluations in the loop used to count in it (a 1 s step with a 10 s evaluation after each read as 11 s)."""
    from qa_train.observe import monitor

    now = [100.0]
    monkeypatch.setattr(monitor.time, "perf_counter", lambda: now[0])
    meter = training(warmup_steps=warmup)
    meter.start()
    for _ in range(steps):
        meter.micro_batch(torch.tensor(1.0), BATCH)
        now[0] += 1.0  # the step
        meter.optimizer_step()
        with meter.excluded("evaluation"):
            now[0] += 10.0
    timed = meter.finish()
    assert (timed.timed_steps, timed.counted.samples) == (steps, 8 * steps)
    assert timed.elapsed_s == pytest.approx(steps * 1.0)


def test_an_evaluation_before_training_starts_is_not_taken_off_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed run's owed evaluation runs before the clock's start: excluding it again from a run timed from its
    start (no more steps than warm-up) took 10 s off 2 s of steps."""
    from qa_train.observe import monitor

    now = [100.0]
    monkeypatch.setattr(monitor.time, "perf_counter", lambda: now[0])
    meter = training(warmup_steps=5)
    with meter.excluded("evaluation"):  # the owed evaluation, before fit starts the metrics
        now[0] += 10.0
    meter.start()
    for _ in range(2):
        meter.micro_batch(torch.tensor(1.0), BATCH)
        now[0] += 1.0
        meter.optimizer_step()
    assert meter.finish().elapsed_s == pytest.approx(2.0)


def test_compile_time_is_the_slowest_ranks_and_absent_without_compiling() -> None:
    compiled = summarize(
        [
            rank(10, 1.0, 1.0, compile_s=41.2, graphs=2, cache=(4, 0)),
            rank(10, 1.0, 1.0, compile_s=52.7, graphs=3, cache=(1, 3)),
            rank(10, 1.0, 1.0, compile_s=9.5, graphs=1, cache=(0, 0)),
        ],
        None,
        False,
    )
    assert (compiled.compile_time_s, compiled.compiled_graphs) == (52.7, 3), "the others wait for the slowest"
    assert (compiled.compile_cache_hits, compiled.compile_cache_misses) == (1, 3), "the slowest rank's cache"
    eager = summarize([rank(10, 1.0, 1.0), rank(10, 1.0, 1.0)], None, False)
    assert eager.compile_time_s is None and eager.compiled_graphs is None, "not 0 s: nothing was compiled"
    assert eager.compile_cache_hits is None and eager.compile_cache_misses is None
