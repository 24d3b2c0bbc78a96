"""A stand-in for the Accelerator that qa_train.observe.recorder.Tracker is given; also imported by the wandb
probes that test_tracking_runs.py starts in their own processes."""

from __future__ import annotations

import types

from qa_train.observe.trackers import Guarded


class Stand(types.SimpleNamespace):
    """What Tracker uses of an Accelerator on the main process: its trackers, started and logged to as
    accelerate does (init_trackers starts each and stores the config; log calls each)."""

    def __init__(self, trackers: list[Guarded], is_main: bool = True) -> None:
        super().__init__(is_main_process=is_main, trackers=[], pending=trackers, configs=[])

    def init_trackers(self, project: str, config: dict) -> None:
        for t in self.pending:
            self.trackers.append(t)
            t.start()
            t.store_init_configuration(config)
        self.configs.append((project, config))

    def log(self, values: dict, step: int) -> None:
        for t in self.trackers:
            t.log(values, step=step)
