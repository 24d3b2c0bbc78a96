"""Distributed evaluation: every rank scores its shard, logits are gathered once, main scores EM/F1."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from qa_train.data import Examples
from qa_train.features import Features
from qa_train.hostmem import HeapTrimmer
from qa_train.postprocess import postprocess_predictions
from qa_train.squad_eval import score

log = logging.getLogger("qa_train")
# Padding logit: far below any real logit, finite so bf16/fp16 stay well-defined.
PAD_LOGIT = -1e4


@torch.no_grad()
def predict_logits(accelerator, model, dataloader, width: int,
                   trimmer: HeapTrimmer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
        trimmer.tick()
    model.train()
    order = torch.cat(index).numpy()
    start_logits = np.empty((len(order), width), dtype=np.float32)
    end_logits = np.empty_like(start_logits)
    start_logits[order] = torch.cat(starts).numpy()
    end_logits[order] = torch.cat(ends).numpy()
    return start_logits, end_logits, order


def evaluate(accelerator, model, dataloader, examples: Examples, features: Features, offsets: np.ndarray | None,
             args, predictions_path: Path | None, trimmer: HeapTrimmer) -> dict[str, float]:
    """EM/F1 on the main process (empty elsewhere); predictions written as {question_id: answer}.

    `offsets` is `window_offsets(...)` of these features, needed on the main process only.
    """
    start_logits, end_logits, order = predict_logits(accelerator, model, dataloader, args.max_seq_length, trimmer)
    if not accelerator.is_main_process:
        return {}
    if len(np.unique(order)) != len(features):
        raise RuntimeError(f"evaluation saw {len(np.unique(order))} of {len(features)} windows")
    predictions = postprocess_predictions(
        start_logits, end_logits, offsets, features.example_index, examples.ids, examples.contexts,
        n_best_size=args.n_best_size, max_answer_length=args.max_answer_length,
    )
    if predictions_path is not None:
        predictions_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = predictions_path.with_name(f".{predictions_path.name}.tmp")
        tmp.write_text(json.dumps(predictions, ensure_ascii=False, indent=1))
        tmp.replace(predictions_path)
    result = score(examples.references(), predictions)
    return {"exact_match": float(result["exact_match"]), "f1": float(result["f1"])}
