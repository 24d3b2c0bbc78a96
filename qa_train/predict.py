"""Answer questions with an exported model, in batches, on a GPU or the CPU.

    qa-train predict MODEL_DIR -q QUESTION -c CONTEXT
    qa-train predict MODEL_DIR --test_file questions.json --output_dir out/ [--version_2_with_negative]

transformers 5 removed the "question-answering" pipeline; this gives the same answer-from-context
call on any exported `final/` directory (and on the hub's QA models). It takes the training code's
path end to end: the tokenizer, model and attention choice of modeling.py, the windows of features.py,
the batches of batching.py, evaluation's inference (accelerate places the model: CUDA when there is
one) and post-processing, so its answers are evaluation's answers. A file of questions (SQuAD JSON or
JSON lines; answers may be absent) gives `predict_predictions.json` and `predict_nbest_predictions.json`,
as `--do_predict` writes them; `accelerate launch -m qa_train.cli predict ...` shares the windows over GPUs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from qa_train.config.outputdir import check_output_folder
from qa_train.config.parser import OneLineParser
from qa_train.config.settings import ANSWERING_KEY, ConfigError, DataArgs, EvalArgs, ModelArgs, answering
from qa_train.core.errors import refusal_text
from qa_train.data.load import DataError, Examples, build_examples, load_file
from qa_train.data.splits import unanswered_note
from qa_train.model.modeling import loading, local_path
from qa_train.squad.postprocess import Answers, SpanRules
from qa_train.strategy.checks import check_inductor_cache
from qa_train.strategy.oom import OutOfMemory

DEVICES = ("auto", "cpu", "cuda")
# Any of these makes a folder's tokenizer (tokenizer.json is what an export writes; the others are the hub's).
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
)


class Predictor:
    """An exported model ready to answer: load once, then `predict` as many questions as needed."""

    def __init__(
        self,
        model_dir: str,
        data: DataArgs | None = None,
        rules: SpanRules | None = None,
        device: str = "auto",
        mixed_precision: str = "auto",
    ) -> None:
        import torch
        from accelerate import Accelerator

        from qa_train.model.modeling import (
            check_positions,
            check_vocab,
            check_weight_shapes,
            load_model,
            load_model_config,
            load_tokenizer,
            uses_token_types,
            weight_shapes,
        )
        from qa_train.strategy.build import resolve_mixed_precision

        if device not in DEVICES:
            raise ConfigError(f"--device: {device!r} is not one of {', '.join(DEVICES)}")
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is available (auto picks the CPU then)")
        check_model_dir(model_dir)
        # Unset: as the exported run answered (its recorded windows and span rules), as the command line does.
        recorded = recorded_answering(model_dir) if data is None or rules is None else RECORDED
        self.data = data or DataArgs(
            dataset_name=None, max_seq_length=recorded["max_seq_length"], doc_stride=recorded["doc_stride"]
        )
        self.rules = rules or SpanRules.of(recorded)
        model_args = ModelArgs(model_name_or_path=model_dir)
        with loading("MODEL_DIR", model_dir, "the model"):
            self.tokenizer = load_tokenizer(model_args)
            config = load_model_config(model_args)
        check_positions(config, self.tokenizer, self.data.max_seq_length, self.data.doc_stride)
        check_vocab(config, self.tokenizer, f"MODEL_DIR {model_dir}", f"MODEL_DIR {model_dir}")
        check_weight_shapes(weight_shapes("MODEL_DIR", model_dir), config, f"MODEL_DIR {model_dir}", "its config.json")
        on_cuda = device != "cpu" and torch.cuda.is_available()
        precision = resolve_mixed_precision(
            mixed_precision, dict(os.environ), on_cuda, on_cuda and torch.cuda.is_bf16_supported()
        )
        self.accelerator = Accelerator(cpu=not on_cuda, mixed_precision=precision)
        with loading("MODEL_DIR", model_dir, "the model"):
            model = load_model(model_args, self.tokenizer, config, trained=True)
        self.model = self.accelerator.prepare_model(model, evaluation_mode=True)
        self.token_types = uses_token_types(config, self.tokenizer)

    def predict(self, examples: Examples) -> Answers | None:
        """Every question's answer and n-best; None on processes other than the main one."""
        from qa_train.data.features import featurize
        from qa_train.data.loaders import collator, inference_loader
        from qa_train.evaluation import EvalSet, answer, predict_logits

        data = self.data
        features = featurize(examples, self.tokenizer, data.max_seq_length, data.doc_stride, with_offsets=True)
        loader = inference_loader(
            features, collator(self.tokenizer, data, self.token_types), data, self.accelerator.device.type == "cuda"
        )
        logits = predict_logits(
            self.accelerator, self.model, self.accelerator.prepare_data_loader(loader), data.max_seq_length
        )
        if not self.accelerator.is_main_process:
            return None
        return answer(EvalSet.build(examples, features, data.max_seq_length), logits, self.rules)


def check_model_dir(model_dir: str) -> None:
    """A MODEL_DIR that cannot be an exported model is refused in one line (ConfigError) before transformers
    tries it: a missing folder, a file, a training checkpoint or a run folder (both say which final/ to use)."""
    from qa_train.strategy.checkpoint import STATE_FILE

    path = Path(model_dir).expanduser()
    if not path.exists():
        if not local_path(model_dir):
            return  # a hub model id; transformers says whether it can be had
        raise ConfigError(f"MODEL_DIR {model_dir}: no such directory")
    if not path.is_dir():
        raise ConfigError(f"MODEL_DIR {model_dir}: is a file, not a model directory")
    # A qa_train checkpoint holds no config.json; transformers' Trainer's checkpoint-N/ does, and loads as a model.
    if (path / STATE_FILE).is_file() and not (path / "config.json").is_file():
        final = path.resolve().parent.parent / "final"
        use = f"use {final}" if (final / "config.json").is_file() else "use the run's final/, which the run exports"
        raise ConfigError(
            f"MODEL_DIR {model_dir}: is a training checkpoint (weights and optimizer state, without "
            f"the model config and tokenizer), not an exported model: {use}"
        )
    if not (path / "config.json").is_file():
        if (path / "final" / "config.json").is_file():
            raise ConfigError(f"MODEL_DIR {model_dir}: is a run directory, not a model: use {path / 'final'}")
        raise ConfigError(
            f"MODEL_DIR {model_dir}: no config.json, so not an exported model (a run's final/ holds "
            "config.json, the weights and the tokenizer)"
        )
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"MODEL_DIR {model_dir}: no tokenizer ({', '.join(TOKENIZER_FILES[:2])}, ...): a run's "
            "final/ holds the tokenizer it trained with"
        )


def command_line_question(
    question: str, context: str, source: str = "<command line>", given_as: str = "-q/-c"
) -> Examples:
    """One question "q", checked as a file's questions are (empty, only invisible characters, ...)."""
    return build_examples([(given_as, {"id": "q", "question": question, "context": context})], source, "optional")


def best_entry(answers: Answers, qid: str) -> dict:
    """{"answer", "score", "probability", "start", "end"} of the question's answer (start/end: characters);
    score None when no window held a valid span (the answer is then "")."""
    text = answers.predictions[qid]
    # The answer's own n-best entry: under SQuAD v2.0 the null may rank first yet lose to the threshold,
    # and a v2.0 "" is the null (start = end = 0), not a zero-width span ranked above it.
    is_null = text == "" and answers.null_odds is not None
    entry = next((e for e in answers.nbest[qid] if e["text"] == text and not (is_null and e["end"])), None)
    if entry is None:
        return {"answer": text, "score": None, "probability": 0.0, "start": 0, "end": 0}
    return {
        "answer": text,
        "score": float(entry["score"]),
        "probability": float(entry["probability"]),
        "start": int(entry["start"]),
        "end": int(entry["end"]),
    }


def answer(
    model_dir: str,
    question: str,
    context: str,
    max_seq_length: int | None = None,
    doc_stride: int | None = None,
    rules: SpanRules | None = None,
) -> dict | None:
    """One question: {"answer", "score", "probability", "start", "end"}; loads the model on every call
    (use a Predictor for many questions). None on processes other than the main one, as Predictor.predict. Unset
    windows and rules: the exported run's (else 384/128 and SpanRules())."""
    examples = command_line_question(question, context, "<input>", "answer()")
    data = None
    if max_seq_length is not None or doc_stride is not None:
        recorded = recorded_answering(model_dir)
        data = DataArgs(
            dataset_name=None,
            max_seq_length=recorded["max_seq_length"] if max_seq_length is None else max_seq_length,
            doc_stride=recorded["doc_stride"] if doc_stride is None else doc_stride,
        )
    answers = Predictor(model_dir, data, rules).predict(examples)
    return best_entry(answers, "q") if answers is not None else None


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="qa-train predict", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model_dir", help="an exported model (a run's final/) or a hub QA model")
    p.add_argument("-q", "--question", help="one question (with --context)")
    p.add_argument("-c", "--context", help="the passage that answers it")
    p.add_argument("--test_file", help="questions to answer: nested SQuAD JSON or JSON lines, answers optional")
    p.add_argument(
        "--output_dir",
        help="write predict_predictions.json and predict_nbest_predictions.json here (default: print the predictions)",
    )
    p.add_argument("--max_predict_samples", type=int, help="answer only the first N questions of --test_file")
    # Unset (None): the exported run's own (its config.json's ANSWERING_KEY), else the fallback in RECORDED.
    p.add_argument("--max_seq_length", type=int, help="tokens per window (default: the run's, else 384)")
    p.add_argument("--doc_stride", type=int, help="overlap between windows of a long context (the run's, else 128)")
    p.add_argument("--per_device_eval_batch_size", type=int, default=64, help="windows per forward pass")
    p.add_argument(
        "--n_best_size", type=int, help="start/end candidates per window and n-best size (the run's, else 20)"
    )
    p.add_argument("--max_answer_length", type=int, help="longest answer in tokens (the run's, else 30)")
    p.add_argument(
        "--version_2_with_negative",
        action="store_true",
        help='SQuAD v2.0: an answer may be "" (on for a model whose run trained so)',
    )
    p.add_argument(
        "--null_score_diff_threshold",
        type=float,
        default=None,  # None: not given, so that one given for a v1.1 model without --version_2_with_negative is refused
        help='v2.0: answer "" when the null score beats the best span by more than this (the run\'s, else 0.0)',
    )
    p.add_argument("--device", default="auto", choices=DEVICES, help="auto: CUDA when available, else CPU")
    p.add_argument(
        "--mixed_precision",
        default="auto",
        choices=("auto", "no", "fp16", "bf16"),
        help="auto: bf16 on a GPU that supports it, fp32 on CPU",
    )
    return p


# What predict answers with where neither a flag nor the exported run says: training's defaults.
RECORDED: dict[str, Any] = answering(DataArgs(dataset_name=None), EvalArgs())


def recorded_answering(model_dir: str) -> dict[str, Any]:
    """The windows and span rules the exported run evaluated with (its config.json's ANSWERING_KEY), checked, over
    RECORDED; RECORDED alone for a model that records none (a hub model, an export from before the record)."""
    path = Path(model_dir).expanduser() / "config.json"
    if not path.is_file():
        return dict(RECORDED)
    try:
        saved = json.loads(path.read_text(encoding="utf-8")).get(ANSWERING_KEY)
    except (ValueError, AttributeError):  # transformers says what is wrong with the config itself
        return dict(RECORDED)
    if saved is None:
        return dict(RECORDED)
    wrong = (
        [key for key in RECORDED if key in saved and not _recordable(key, saved[key])]
        if isinstance(saved, dict)
        else ["it"]
    )
    if wrong:
        raise ConfigError(f"{path}: {ANSWERING_KEY} is not a qa_train export's record (at {', '.join(wrong)})")
    return {**RECORDED, **{key: saved[key] for key in RECORDED if key in saved}}


def _recordable(key: str, value: object) -> bool:
    if key == "version_2_with_negative":
        return isinstance(value, bool)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key == "null_score_diff_threshold":
        return value is None or number
    return number and isinstance(value, int)


def _settings(args: argparse.Namespace, recorded: dict[str, Any]) -> tuple[DataArgs, SpanRules]:
    """The window and answer settings: each flag given, else the exported run's (`recorded`); validated as training
    validates them (ConfigError names the flag)."""
    if (args.test_file is None) == (args.question is None or args.context is None):
        raise ConfigError("give either --question and --context, or --test_file")
    # As training refuses them: a flag that could do nothing here is refused, not ignored.
    if args.max_predict_samples is not None and args.test_file is None:
        raise ConfigError("--max_predict_samples: truncates --test_file's questions, and -q/-c ask one: drop it")
    v2 = args.version_2_with_negative or bool(recorded["version_2_with_negative"])
    threshold = args.null_score_diff_threshold
    if threshold is not None and not v2:
        raise ConfigError(
            "--null_score_diff_threshold: only decides SQuAD v2.0's empty answers: add --version_2_with_negative, "
            "or drop it"
        )
    given = {flag: getattr(args, flag) for flag in RECORDED if flag != "version_2_with_negative"}
    value = {**recorded, **{flag: v for flag, v in given.items() if v is not None}, "version_2_with_negative": v2}
    data = DataArgs(
        dataset_name=None,
        test_file=args.test_file,
        max_seq_length=value["max_seq_length"],
        doc_stride=value["doc_stride"],
        per_device_eval_batch_size=args.per_device_eval_batch_size,
        max_predict_samples=args.max_predict_samples,
    )
    for flag in ("n_best_size", "max_answer_length"):
        if value[flag] < 1:
            raise ConfigError(f"--{flag}: must be positive, got {value[flag]}")
    # As training refuses them: every comparison with nan is false, and an infinite margin decides every question
    # alike (always or never the empty answer).
    if threshold is not None and not math.isfinite(threshold):
        raise ConfigError(f"--null_score_diff_threshold: must be a finite number, got {threshold}")
    return data, SpanRules.of(value)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        data, rules = _settings(args, recorded_answering(args.model_dir))
        check_inductor_cache(os.environ)  # else blamed on MODEL_DIR, when the model's import makes it
        if args.output_dir:
            check_output_folder(args.output_dir)
        if args.test_file:
            examples = load_file(args.test_file, "optional").head(args.max_predict_samples)
        else:
            examples = command_line_question(args.question, args.context)
        predictor = Predictor(args.model_dir, data, rules, args.device, args.mixed_precision)
        answers = predictor.predict(examples)
        predictor.accelerator.end_training()  # a rank under a launcher leaves its process group: no gloo thread at exit
    except (ConfigError, DataError, OSError) as err:
        print(f"qa-train predict: error: {refusal_text(err)}", file=sys.stderr)
        return 2
    except OutOfMemory as err:  # the same exit code as training's
        print(f"qa-train predict: error: {err}", file=sys.stderr)
        return 7
    if answers is None:  # not the main process
        return 0
    note = unanswered_note(examples, rules.null_score_diff_threshold is not None)
    if note:
        print(f"note: {note}", file=sys.stderr)
    if args.output_dir:
        from qa_train.evaluation import write_answers

        print(write_answers(Path(args.output_dir), "predict", answers))
    elif args.test_file:
        print(json.dumps(answers.predictions, ensure_ascii=False, indent=1))
    else:
        print(json.dumps(best_entry(answers, "q"), ensure_ascii=False))
    return 0
