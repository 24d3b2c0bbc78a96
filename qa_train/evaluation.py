"""Distributed evaluation: every rank scores its shard, logits are gathered once, main scores EM/F1."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from qa_train.data import Examples
from qa_train.features import Features, window_offsets
from qa_train.hostmem import HostMemory
from qa_train.postprocess import Questions, SpanRules, postprocess_predictions
from qa_train.squad_eval import exact_match, f1, score

# Padding logit: far below any real logit, finite so bf16/fp16 stay well-defined.
PAD_LOGIT = -1e4


@dataclass
class EvalSet:
    """The evaluation split as post-processing reads it; `offsets` is built once for every evaluation."""

    examples: Examples
    features: Features
    offsets: np.ndarray  # [F, width, 2] character offsets of each window's tokens

    @classmethod
    def build(cls, examples: Examples, features: Features, width: int) -> EvalSet:
        return cls(examples, features, window_offsets(features, width))

    @property
    def questions(self) -> Questions:
        return Questions(self.features.example_index, self.examples.ids, self.examples.contexts)


@dataclass
class EvalResult:
    exact_match: float
    f1: float
    runtime_s: float = 0.0
    predictions: dict[str, str] | None = None


SAMPLE_COLUMNS = ["id", "question", "gold answers", "prediction", "exact_match", "f1"]


def sample_rows(examples: Examples, predictions: dict[str, str], limit: int) -> list[list[object]]:
    """Up to `limit` questions spread evenly over the split (not all from its first article), each with its
    own EM and F1: the table a reader scans to see what the model gets wrong."""
    picked = np.unique(np.linspace(0, len(examples) - 1, num=min(limit, len(examples))).astype(int))
    rows: list[list[object]] = []
    for i in picked.tolist():
        golds, pred = examples.answer_texts[i], predictions.get(examples.ids[i], "")
        rows.append([examples.ids[i], examples.questions[i], " | ".join(golds), pred,
                     max(exact_match(pred, g) for g in golds), round(max(f1(pred, g) for g in golds), 4)])
    return rows


@torch.no_grad()
def predict_logits(accelerator, model, dataloader, width: int,
                   host_memory: HostMemory) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start/end logits for every feature, in feature order, each counted once.

    Batches are padded to different widths, so logits are padded to `width` before gathering;
    gather_for_metrics drops the samples the sampler repeated to even out the last batch.
    """
    model.eval()
    starts, ends, index = [], [], []
    for batch in dataloader:
        feature_index = batch.pop("feature_index")
        batch.pop("num_tokens")
        batch.pop("start_positions", None)
        batch.pop("end_positions", None)
        out = model(**batch)
        pad = width - out.start_logits.shape[1]
        s = F.pad(out.start_logits.float(), (0, pad), value=PAD_LOGIT)
        e = F.pad(out.end_logits.float(), (0, pad), value=PAD_LOGIT)
        s, e, feature_index = accelerator.gather_for_metrics((s, e, feature_index))
        starts.append(s.cpu())
        ends.append(e.cpu())
        index.append(feature_index.cpu())
        host_memory.step()
    model.train()
    order = torch.cat(index).numpy()
    start_logits = np.empty((len(order), width), dtype=np.float32)
    end_logits = np.empty_like(start_logits)
    start_logits[order] = torch.cat(starts).numpy()
    end_logits[order] = torch.cat(ends).numpy()
    return start_logits, end_logits, order


def answer_and_score(eval_set: EvalSet, logits: tuple[np.ndarray, np.ndarray, np.ndarray],
                     rules: SpanRules) -> tuple[dict[str, str], EvalResult]:
    """Predictions {question_id: answer} and their EM/F1 against the gold answers."""
    start_logits, end_logits, order = logits
    if len(np.unique(order)) != len(eval_set.features):
        raise RuntimeError(f"evaluation saw {len(np.unique(order))} of {len(eval_set.features)} windows")
    predictions = postprocess_predictions(start_logits, end_logits, eval_set.offsets, eval_set.questions, rules)
    result = score(eval_set.examples.references(), predictions)
    return predictions, EvalResult(float(result["exact_match"]), float(result["f1"]), predictions=predictions)


def write_predictions(path: Path, predictions: dict[str, str]) -> None:
    """Atomic: a crash mid-write never leaves half a predictions file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(predictions, ensure_ascii=False, indent=1))
    tmp.replace(path)
