"""Answer questions with an exported model: `python -m qa_train.predict MODEL_DIR -q QUESTION -c CONTEXT`.

transformers 5 removed the "question-answering" pipeline; this gives the same answer-from-context
call on any exported `final/` directory (and on the pipeline's own models), using the training
code's windowing and n-best post-processing so answers match evaluation exactly.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from qa_train.data import Examples
from qa_train.features import featurize, window_offsets
from qa_train.postprocess import Questions, SpanRules, postprocess_predictions


def answer(model_dir: str, question: str, context: str, max_seq_length: int = 384, doc_stride: int = 128,
           rules: SpanRules = SpanRules()) -> dict:
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir).eval()
    examples = Examples(source="<input>")
    examples.append("q", "", context, question, [], [])
    feats = featurize(examples, tokenizer, max_seq_length, doc_stride, with_offsets=True)
    starts = np.full((len(feats), max_seq_length), -1e4, dtype=np.float32)
    ends = starts.copy()
    with torch.no_grad():
        for f in range(len(feats)):
            lo, hi = feats.row_start[f], feats.row_start[f + 1]
            ids = torch.as_tensor(feats.input_ids[lo:hi], dtype=torch.long)[None]
            types = torch.as_tensor(feats.token_type_ids[lo:hi], dtype=torch.long)[None]
            out = model(input_ids=ids, token_type_ids=types, attention_mask=torch.ones_like(ids))
            starts[f, : hi - lo] = out.start_logits[0].numpy()
            ends[f, : hi - lo] = out.end_logits[0].numpy()
    offsets = window_offsets(feats, max_seq_length)
    questions = Questions(feats.example_index, examples.ids, examples.contexts)
    _, nbest = postprocess_predictions(starts, ends, offsets, questions, rules,
                                       return_nbest=True)
    best = nbest["q"][0] if nbest["q"] else {"text": "", "score": float("nan"), "start": 0, "end": 0}
    return {"answer": best["text"], "score": float(best["score"]), "start": int(best["start"]),
            "end": int(best["end"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("model_dir")
    p.add_argument("-q", "--question", required=True)
    p.add_argument("-c", "--context", required=True)
    args = p.parse_args(argv)
    print(json.dumps(answer(args.model_dir, args.question, args.context)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
