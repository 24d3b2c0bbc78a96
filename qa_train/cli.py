"""`qa-train VERB [flags]`: one command for everything qa-train does, as `accelerate` and `litgpt` have.

`python -m qa_train [flags]` stays the training entry point that launchers run (`accelerate launch ... -m
qa_train`); `qa-train train` is the same run. Each verb's own `--help` lists its flags.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

# verb -> (module, what it does). Modules are imported only for the verb asked: `qa-train report` must not pay
# for torch's and transformers' imports.
VERBS: dict[str, tuple[str, str]] = {
    "train": ("qa_train.__main__", "train and evaluate one run in this process (what every launched rank runs)"),
    "launch": ("qa_train.strategy.launch", "run `train` under an accelerate config: DDP, FSDP, ZeRO, on GPUs or CPU"),
    "bench": ("qa_train.studies.bench", "the same run under several configs, process counts or repeats; one report"),
    "report": ("qa_train.studies.report", "compare finished runs: table, plots, W&B summary"),
    "plan": ("qa_train.studies.plan_command", "memory per GPU and traffic per step of every strategy, before you run"),
    "predict": ("qa_train.predict", "answer the questions of a SQuAD file with an exported model"),
    "score": ("qa_train.squad.scoring", "SQuAD v1.1 / v2.0 exact match and F1 of a predictions file"),
    "dashboard": ("qa_train.observe.dashboard", "one run's history on one page, from its step log"),
    "describe": (
        "qa_train.strategy.describe",
        "what a checkpoint holds, and which configs and world sizes continue it",
    ),
    "consolidate": ("qa_train.model.consolidate", "a checkpoint of any strategy as a from_pretrained model folder"),
}


# The verbs a launcher runs as ranks: their processes end without the interpreter's teardown (core/teardown.py).
RANK_VERBS = ("train", "predict")


def usage() -> str:
    width = max(map(len, VERBS))
    lines = [f"  {verb:<{width}}  {what}" for verb, (_, what) in VERBS.items()]
    return "usage: qa-train VERB [flags]   (qa-train VERB --help for a verb's flags)\n\nverbs:\n" + "\n".join(lines)


def entry_point(verb: str) -> Callable[[list[str]], int]:
    module = importlib.import_module(VERBS[verb][0])
    return module.entry if verb == "train" else module.main


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    verb, rest = args[0], args[1:]
    if verb not in VERBS:
        print(f"qa-train: error: unknown verb {verb!r}\n\n{usage()}", file=sys.stderr)
        return 2
    if verb not in RANK_VERBS:
        return entry_point(verb)(rest)
    from qa_train.core import teardown

    teardown.arm()  # before the verb's imports register exit handlers of their own
    # Also spares the collection at exit, which walked every object left for memory the OS takes back anyway.
    return teardown.leave(entry_point(verb)(rest))


if __name__ == "__main__":
    sys.exit(main())
