"""Distributed evaluation and prediction: every rank runs its shard, logits are gathered once, main answers
(and, with gold answers, scores EM/F1: SQuAD v1.1, or v2.0's official metrics)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from qa_train.data.features import Features, window_offsets
from qa_train.data.load import Examples
from qa_train.observe.hostmem import HostMemory
from qa_train.observe.recorder import atomic_write_text
from qa_train.squad.postprocess import Answers, Questions, SpanRules, answer_questions
from qa_train.squad.scoring import question_scores, score, score_v2
from qa_train.strategy.oom import in_evaluation, is_out_of_memory

# Padding logit: far below any real logit, finite so bf16/fp16 stay well-defined.
PAD_LOGIT = -1e4


@dataclass
class EvalSet:
    """A split (evaluation or --test_file) as post-processing reads it; `offsets` is built once."""

    examples: Examples
    features: Features
    offsets: np.ndarray  # [F, width, 2] character offsets of each window's tokens

    @classmethod
    def build(cls, examples: Examples, features: Features, width: int) -> EvalSet:
        return cls(examples, features, window_offsets(features, width))

    @property
    def questions(self) -> Questions:
        return Questions(
            self.features.example_index, self.examples.ids, self.examples.contexts, self.features.cls_index
        )


@dataclass
class EvalResult:
    exact_match: float
    f1: float
    runtime_s: float = 0.0
    predictions: dict[str, str] | None = None
    squad_v2: dict[str, Any] | None = None  # the official v2.0 metrics (exact and f1 are the two above)


SAMPLE_COLUMNS = ["id", "question", "gold answers", "prediction", "exact_match", "f1"]


def sample_rows(examples: Examples, predictions: dict[str, str], limit: int, *, v2: bool) -> list[list[object]]:
    """Up to `limit` questions spread evenly over the split (not all from its first article), each with its
    own official EM and F1 (SQuAD v2.0's with `v2`): the table a reader scans to see what the model gets wrong."""
    picked = np.unique(np.linspace(0, len(examples) - 1, num=min(limit, len(examples))).astype(int))
    rows: list[list[object]] = []
    for i in picked.tolist():
        golds, pred = examples.answer_texts[i], predictions.get(examples.ids[i], "")
        em, f = question_scores(pred, golds, v2=v2)
        rows.append([examples.ids[i], examples.questions[i], " | ".join(golds), pred, em, round(f, 4)])
    return rows


# Gathered logits wait on the device for this many batches before one copy to the host: a .cpu() per batch
# would make the host wait for each forward before it can queue the next (64 x 384 x 2 fp32 logits a batch,
# so 32 batches hold ~6 MB).
DRAIN_EVERY = 32


@torch.no_grad()
def predict_logits(
    accelerator, model, dataloader, width: int, host_memory: HostMemory | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start/end logits for every feature, in feature order, each counted once.

    Batches are padded to different widths, so logits are padded to `width` before gathering;
    gather_for_metrics drops the samples the sampler repeated to even out the last batch.
    `host_memory` (None outside a training run) trims the heap between batches.
    """
    model.eval()
    pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    host: list[tuple[torch.Tensor, ...]] = []  # (start logits, end logits, feature index) on the host

    def drain() -> None:
        if pending:
            host.append(tuple(torch.cat(parts).cpu() for parts in zip(*pending)))
            pending.clear()

    # Eagerly under --torch_compile: compiling the no-grad graph, a second one, costs more than a SQuAD-sized
    # evaluation takes eagerly on a GPU (docs/benchmarks/2026-11-26-gpu-h100-compiled.md). Here, not as a
    # decorator, which would import dynamo with this module.
    with torch.compiler.set_stance("force_eager"):
        for batch in dataloader:
            feature_index = batch.pop("feature_index")
            batch.pop("num_tokens")
            batch.pop("num_windows", None)
            batch.pop("start_positions", None)
            batch.pop("end_positions", None)
            try:
                out = model(**batch)
            except (RuntimeError, MemoryError) as err:
                if not is_out_of_memory(err):
                    raise
                raise in_evaluation(err, *batch["input_ids"].shape) from err
            pad = width - out.start_logits.shape[1]
            s = F.pad(out.start_logits.float(), (0, pad), value=PAD_LOGIT)
            e = F.pad(out.end_logits.float(), (0, pad), value=PAD_LOGIT)
            pending.append(accelerator.gather_for_metrics((s, e, feature_index)))
            if len(pending) == DRAIN_EVERY:
                drain()
            if host_memory is not None:
                host_memory.step()
    drain()
    model.train()
    starts, ends, index = zip(*host)
    order = torch.cat(index).numpy()
    start_logits = np.empty((len(order), width), dtype=np.float32)
    end_logits = np.empty_like(start_logits)
    start_logits[order] = torch.cat(starts).numpy()
    end_logits[order] = torch.cat(ends).numpy()
    return start_logits, end_logits, order


def answer(eval_set: EvalSet, logits: tuple[np.ndarray, np.ndarray, np.ndarray], rules: SpanRules) -> Answers:
    """Every question's answer and n-best from logits that cover every window exactly once."""
    start_logits, end_logits, order = logits
    if not np.array_equal(np.sort(order), np.arange(len(eval_set.features))):
        raise RuntimeError(
            f"inference returned {len(order)} windows ({len(np.unique(order))} distinct) for "
            f"{len(eval_set.features)}: every window must be seen exactly once"
        )
    return answer_questions(start_logits, end_logits, eval_set.offsets, eval_set.questions, rules)


def answer_and_score(
    eval_set: EvalSet, logits: tuple[np.ndarray, np.ndarray, np.ndarray], rules: SpanRules
) -> tuple[Answers, EvalResult]:
    """Answers and their EM/F1 against the gold answers; SQuAD v2.0's official metrics with a null threshold,
    computed as the official script does from the predictions, the null odds and that threshold."""
    answers = answer(eval_set, logits, rules)
    references = eval_set.examples.references()
    if rules.null_score_diff_threshold is None:
        result = score(references, answers.predictions)
        return answers, EvalResult(float(result["exact_match"]), float(result["f1"]), predictions=answers.predictions)
    v2 = score_v2(references, answers.predictions, answers.null_odds, rules.null_score_diff_threshold)
    return answers, EvalResult(float(v2["exact"]), float(v2["f1"]), predictions=answers.predictions, squad_v2=v2)


def _write_json(path: Path, payload: object) -> None:
    """Atomic: a crash mid-write never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(payload, ensure_ascii=False, indent=1))


def write_predictions(path: Path, answers: Answers) -> None:
    """{question_id: answer} at `path`; for SQuAD v2.0 also the null odds beside it (`..._null_odds.json`),
    what the official script takes as --na-prob-file (with --na-prob-thresh = --null_score_diff_threshold)."""
    _write_json(path, answers.predictions)
    if answers.null_odds is not None:
        _write_json(path.with_name(path.name.replace("predictions", "null_odds")), answers.null_odds)


def write_answers(output_dir: Path, prefix: str, answers: Answers) -> Path:
    """`{prefix}_predictions.json` (with v2.0's null odds) and `{prefix}_nbest_predictions.json`, as
    transformers' run_qa names them; returns the predictions file."""
    path = output_dir / f"{prefix}_predictions.json"
    write_predictions(path, answers)
    _write_json(output_dir / f"{prefix}_nbest_predictions.json", answers.nbest)
    return path
