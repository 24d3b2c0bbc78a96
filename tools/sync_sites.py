"""Where does a qa_train run make the host wait for the GPU? Runs one training in this process under
torch.cuda.set_sync_debug_mode("warn") and records each synchronizing CUDA operation of the training loop
with the step and phase it fell in and the Python line that caused it.

    python tools/sync_sites.py SITES.json -- [qa_train flags]      # one process, on a CUDA GPU

Phases: "loader" (fetching and placing the next batch), "step" (forward, backward, optimizer), "after" (the
update's bookkeeping: logging, checkpoints), "eval" (evaluation during training). A sync inside "loader" or
"step" stalls every step: the host cannot queue the next step's work while the GPU finishes this one; one in
every evaluation batch stalls evaluation likewise. Setup, the weight check after the last step, the final
evaluation and export are not recorded. Writes [[step, phase, file, line], ...] and prints the sites by count. Without CUDA nothing syncs
and the list is empty.
"""

from __future__ import annotations

import collections
import json
import sys
import warnings

import torch


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] != "--":
        raise SystemExit(__doc__)
    out, flags = argv[0], argv[2:]
    from qa_train import trainer

    sites: list[list[object]] = []
    where: dict[str, object] = {"phase": None, "trainer": None}

    def phase(name: str, method):
        def wrapped(self, *args, **kwargs):
            # Restored, not reset: evaluation runs inside the update's bookkeeping, which goes on after it.
            before = where["phase"]
            where["phase"], where["trainer"] = name, self
            try:
                return method(self, *args, **kwargs)
            finally:
                where["phase"] = before

        return wrapped

    # Inside an epoch, outside the step and the bookkeeping, the loop is fetching and placing the next batch. Not
    # fit: what it does once after the loop (the final weight check) stalls no step.
    # A checkpoint is the update's bookkeeping also where an epoch's end writes it, outside _after_update.
    phases = {
        "_train_epoch": "loader",
        "_micro_step": "step",
        "_after_update": "after",
        "_save_checkpoint": "after",
        "_evaluate_during_training": "eval",
    }
    originals = {name: getattr(trainer.Trainer, name) for name in phases}
    for name, method in originals.items():
        setattr(trainer.Trainer, name, phase(phases[name], method))

    show = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return show(message, category, filename, lineno, file, line)
        if where["phase"] is not None:
            sites.append([where["trainer"].state.completed_steps, where["phase"], filename, lineno])

    warnings.showwarning = record
    warnings.simplefilter("always")
    if torch.cuda.is_available():
        torch.cuda.set_sync_debug_mode("warn")
    from qa_train.__main__ import main as qa_train_main

    try:
        code = qa_train_main(flags)
    finally:
        warnings.showwarning = show
        for name, method in originals.items():
            setattr(trainer.Trainer, name, method)
        with open(out, "w") as f:
            json.dump(sites, f)
        counts = collections.Counter((p, f"{f}:{n}") for _, p, f, n in sites)
        steps = len({s for s, *_ in sites})
        print(f"{len(sites)} synchronizing operations in the training loop, over {steps} step(s):")
        for (p, site), n in counts.most_common():
            print(f"  {n:6d}  {p:6s}  {site}")
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
