"""Measure what CPU training takes above the idle baseline for BERT shapes, and fit the planner's CPU calibration.

    python tools/calibrate_planner.py [--output_dir runs/calibration] [--skip_runs]

Trains each shape below for 6 steps in one process (fp32, every batch padded to the full length, so the
sequence length is exact), then fits measured = model states + scale x activations (the tensor count) +
overhead by least squares on the relative error, and prints every run's estimate against its measurement,
raw and calibrated. The result goes into `CPU_CALIBRATION` in qa_train/studies/memory_model.py by hand. Development
only: not shipped in the package.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qa_train.observe.schema import RunMetrics  # noqa: E402
from qa_train.studies import memory_model as memplan  # noqa: E402
from qa_train.studies.planner import load_shape_config, model_shape  # noqa: E402
from qa_train.studies.planner_check import measured_gib  # noqa: E402

TINY = ROOT / "qa_train" / "assets" / "tiny-bert"
DEMO = ROOT / "qa_train" / "assets" / "demo"
# (name, layers, hidden, heads, intermediate, dropout, batch, seq, attention); None sizes keep the tiny BERT's.
RUNS = [
    ("tiny", None, None, None, None, 0.0, 8, 192, "sdpa"),
    ("tiny", None, None, None, None, 0.0, 32, 256, "sdpa"),
    ("mini", 4, 256, 4, 1024, 0.0, 8, 256, "sdpa"),
    ("mini", 4, 256, 4, 1024, 0.0, 32, 128, "sdpa"),
    ("small", 4, 512, 8, 2048, 0.0, 8, 256, "sdpa"),
    ("small", 4, 512, 8, 2048, 0.0, 16, 128, "sdpa"),
    ("medium", 6, 768, 12, 3072, 0.0, 4, 256, "sdpa"),
    ("medium", 6, 768, 12, 3072, 0.0, 16, 256, "sdpa"),
    ("wide2", 2, 512, 8, 2048, 0.0, 16, 256, "sdpa"),
    ("deep8", 8, 256, 4, 1024, 0.0, 16, 256, "sdpa"),
    ("small-dropout", 4, 512, 8, 2048, 0.1, 8, 192, "sdpa"),
    ("base-layers", 12, 768, 12, 3072, 0.1, 4, 256, "sdpa"),
    ("mini-eager", 4, 256, 4, 1024, 0.0, 8, 256, "eager"),
]


def write_shape(folder: Path, layers, hidden, heads, inter, dropout: float) -> Path:
    config = json.loads((TINY / "config.json").read_text())
    sizes = {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": inter,
    }
    config.update({k: v for k, v in sizes.items() if v is not None})
    config.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def train(run: tuple, out: Path) -> Path:
    name, layers, hidden, heads, inter, dropout, batch, seq, attention = run
    shape = write_shape(out / "shapes" / f"{name}", layers, hidden, heads, inter, dropout)
    run_dir = out / f"{name}-b{batch}-s{seq}"
    cmd = [
        sys.executable,
        "-m",
        "qa_train",
        "--config_name",
        str(shape),
        "--tokenizer_name",
        str(TINY),
        "--train_file",
        str(DEMO / "train.json"),
        "--max_seq_length",
        str(seq),
        "--doc_stride",
        "64",
        "--pad_to_max_length",
        "--per_device_train_batch_size",
        str(batch),
        "--max_train_steps",
        "6",
        "--no_eval",
        "--report_to",
        "none",
        "--save_final_model",
        "false",
        "--mixed_precision",
        "no",
        "--attn_implementation",
        attention,
        "--output_dir",
        str(run_dir),
        "--overwrite_output_dir",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return run_dir


def terms(run_dir: Path) -> tuple[float, float, float, RunMetrics]:
    """(model states, activation tensor count, measured) in bytes, and the metrics."""
    m = RunMetrics.read(run_dir)
    shape = model_shape(load_shape_config(None, m.args["config_name"]))
    setup = memplan.Setup(
        1, 1, m.per_device_train_batch_size, m.max_seq_length, "no", m.args["attn_implementation"], "cpu"
    )
    states = memplan.model_states("single", shape, setup)[0]
    tensors = memplan.saved_activation_bytes(shape, setup) + memplan.backward_transient_bytes(shape, setup)
    measured, why = measured_gib(m)  # (GiB, None) or (None, why): multiplying the pair itself repeats the tuple
    if measured is None:
        raise SystemExit(f"{run_dir}: {why}")
    return states, tensors, measured * memplan.GIB, m


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", default="runs/calibration")
    p.add_argument("--skip_runs", action="store_true", help="Fit the runs already in --output_dir.")
    opts = p.parse_args()
    out = Path(opts.output_dir).resolve()
    dirs = [out / f"{r[0]}-b{r[6]}-s{r[7]}" if opts.skip_runs else train(r, out) for r in RUNS]
    rows = [(d.name, *terms(d)) for d in dirs]
    fit = [r for r in rows if not r[0].startswith("mini-eager")]  # eager is checked, not fitted
    weights = np.array([1 / r[3] for r in fit])
    a = np.array([[r[2], 1.0] for r in fit]) * weights[:, None]
    (scale, overhead), *_ = np.linalg.lstsq(a, np.array([r[3] - r[1] for r in fit]) * weights, rcond=None)
    print(f"fit on {len(fit)} runs: activations x {scale:.3f} + {overhead / 2**20:.1f} MiB\n")
    print(
        "| run | parameters | measured GiB | raw estimate / measured | calibrated / measured |\n|---|---|---|---|---|"
    )
    for name, states, tensors, measured, m in rows:
        calibrated = states + scale * tensors + overhead
        print(
            f"| {name} | {m.num_parameters / 1e6:.1f}M | {measured / memplan.GIB:.3f} | "
            f"{(states + tensors) / measured:.2f} | {calibrated / measured:.2f} |"
        )


if __name__ == "__main__":
    main()
