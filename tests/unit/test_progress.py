"""Progress: a bar on a terminal, plain lines in a log file, nothing when disabled or on other ranks."""

from __future__ import annotations

import io
import logging
import re

import pytest

from qa_train.observe.progress import Progress, ProgressOutput


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_with_throughput_and_the_last_loss() -> None:
    screen = Terminal()
    progress = Progress("train", 4, 0, "step", 16, output=ProgressOutput(True, 30.0, screen))
    for _ in range(4):
        progress.update()
        progress.note(loss=2.5, lr=1e-3)
    progress.close()
    text = screen.getvalue()
    assert "\r" in text and "train" in text and "4/4" in text
    assert "samples/s=" in text and "loss=2.5" in text and "lr=0.001" in text


def test_a_log_file_gets_a_line_per_interval_and_at_the_end(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="qa_train")
    log_file = io.StringIO()  # not a terminal
    progress = Progress("train", 10, 2, "step", 8, output=ProgressOutput(True, 3600.0, log_file))
    for _ in range(8):
        progress.update()
    assert log_file.getvalue() == ""  # no bar
    [line] = [r.getMessage() for r in caplog.records]  # the interval never passed: only the last step's line
    assert re.fullmatch(r"train 10/10 steps \(100%\), [\d.]+ samples/s, elapsed 0:00:\d\d, ETA 0:00:00", line), line


def test_every_step_with_interval_zero_and_resumed_counts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="qa_train")
    progress = Progress("train", 6, 3, "step", 8, output=ProgressOutput(True, 0.0, io.StringIO()))
    progress.note(loss=1.25)
    for _ in range(3):
        progress.update()
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" (")[0] for line in lines] == ["train 4/6 steps", "train 5/6 steps", "train 6/6 steps"]
    assert all("loss 1.25" in line for line in lines)


def test_disabled_progress_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="qa_train")
    screen = Terminal()
    progress = Progress("eval", 3, 0, "batch", 64, output=ProgressOutput(False, 0.0, screen))
    assert list(progress.over(range(3))) == [0, 1, 2]
    progress.close()
    assert screen.getvalue() == "" and not caplog.records


@pytest.fixture
def setup_logging(monkeypatch: pytest.MonkeyPatch):
    """qa_train's logging set-up, with the library loggers' levels and transformers' bars restored after."""
    from transformers.utils import logging as hf_logging

    from qa_train import trainer

    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: None)  # leave pytest's handlers alone
    levels = {
        name: logging.getLogger(name).level
        for name in ("transformers", "datasets", "accelerate", "DeepSpeed", "torch.distributed")
    }
    yield trainer.setup_logging
    hf_logging.enable_progress_bar()
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_library_progress_bars_are_the_main_process_alone(setup_logging) -> None:
    """Every rank loads weights, and transformers drew a "Loading weights" bar for each: off on the other ranks,
    and on the main process too under --disable_tqdm (its export drew "Writing model shards")."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # as an earlier run in this process with --disable_tqdm left it
    setup_logging(is_main=True, bars=True)
    assert hf_logging.is_progress_bar_enabled()
    setup_logging(is_main=False, bars=True)
    assert not hf_logging.is_progress_bar_enabled()
    setup_logging(is_main=True, bars=True)
    setup_logging(is_main=True, bars=False)
    assert not hf_logging.is_progress_bar_enabled()


def test_deepspeeds_use_of_a_deprecated_collective_is_not_shown(setup_logging) -> None:
    """ZeRO runs printed torch's FutureWarnings for all_gather_into_tensor (ZeRO-2 and 3) and reduce_scatter_tensor
    (ZeRO-3) on every rank; other warnings stay."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:  # restores the filters afterwards
        warnings.simplefilter("always")
        setup_logging(is_main=True, bars=True)
        warnings.warn(
            "`torch.distributed.all_gather_into_tensor` is deprecated. Please use "
            "`torch.distributed.all_gather_single` instead.",
            FutureWarning,
        )
        warnings.warn(
            "`torch.distributed.reduce_scatter_tensor` is deprecated. Please use "
            "`torch.distributed.reduce_scatter_single` instead.",
            FutureWarning,
        )
        warnings.warn("`torch.distributed.something_else` is deprecated.", FutureWarning)
    assert [str(w.message) for w in seen] == ["`torch.distributed.something_else` is deprecated."]
