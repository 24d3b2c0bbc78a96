"""qa_train.observe.recorder: W&B failures never stop training; metrics.json, the step log and the summary table."""

from __future__ import annotations

import errno
import io
import json
import math
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
from fake_accelerator import Stand

from qa_train.config.settings import TRACKERS, ConfigError, OutputArgs
from qa_train.observe import recorder as tracking
from qa_train.observe import trackers
from qa_train.observe.recorder import Tracker, summary_table
from qa_train.observe.schema import PerRank, RunMetrics
from qa_train.observe.trackers import Guarded, build_trackers


class FakeRun:
    def __init__(self, fail_log_on: int | None = None, fail_summary: bool = False) -> None:
        self.name = "fake-run"
        self.logged: list[tuple[dict, int]] = []
        self.metrics: list[tuple[str, dict]] = []
        self.finished = 0
        self.summaries: list[dict] = []
        self.fail_log_on, self.fail_summary = fail_log_on, fail_summary
        self.summary = types.SimpleNamespace(update=self._update)
        self.config = types.SimpleNamespace(update=lambda values, allow_val_change: None)

    def define_metric(self, name: str, **kwargs: Any) -> None:
        self.metrics.append((name, kwargs))

    def log(self, values: dict, step: int | None = None) -> None:
        self.logged.append((values, step))
        if len(self.logged) == self.fail_log_on:
            raise ConnectionError("wandb backend went away")

    def finish(self) -> None:
        self.finished += 1

    def _update(self, summary: dict) -> None:
        self.summaries.append(summary)
        if self.fail_summary:
            raise RuntimeError("summary rejected")


class FakeSettings(types.SimpleNamespace):
    pass


class FakeWandb(types.ModuleType):
    Settings = FakeSettings

    def __init__(
        self, run: FakeRun | None = None, init_error: Exception | None = None, online_error: Exception | None = None
    ) -> None:
        super().__init__("wandb")
        self.run, self.init_error, self.online_error = run or FakeRun(), init_error, online_error
        self.inits: list[dict[str, Any]] = []
        self.setups: list[FakeSettings] = []

    def setup(self, settings: FakeSettings) -> None:
        self.setups.append(settings)

    def init(self, **kwargs: Any) -> FakeRun:
        self.inits.append(kwargs)
        if self.online_error is not None and kwargs["mode"] == "online":
            raise self.online_error
        if self.init_error is not None:
            raise self.init_error
        return self.run


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    for var in (
        "WANDB_API_KEY",
        "WANDB_MODE",
        "WANDB_BASE_URL",
        "WANDB_RUN_GROUP",
        "WANDB_RUN_ID",
        "WANDB_INIT_TIMEOUT",
    ):
        monkeypatch.delenv(var, raising=False)
    netrc = tmp_path_factory.mktemp("home") / "empty.netrc"  # outside tmp_path, which tests list
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeWandb) -> FakeWandb:
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return fake


def metrics(**kw: Any) -> RunMetrics:
    base = dict(
        strategy="zero2",
        zero_stage=2,
        offload="none",
        world_size=2,
        mixed_precision="bf16",
        exact_match=81.25,
        f1=88.5,
        train_steps=30,
        global_batch_size=16,
        train_samples_per_second=12.5,
        peak_memory_gb=PerRank.of([1.5, 2.5]),
        train_loss_per_rank=[0.5, 0.5],
        args={"learning_rate": 3e-5, "output_dir": "out"},
    )
    return RunMetrics(**{**base, **kw})


def step_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def wandb_tracker(out: Path, **kwargs: Any) -> Guarded:
    (tracker,) = build_trackers(["wandb"], out, "qa", kwargs)
    return tracker


def started(out: Path, **kwargs: Any) -> Guarded:
    tracker = wandb_tracker(out, **kwargs)
    tracker.start()
    return tracker


def run_steps(tracker: Tracker, n: int) -> None:
    for step in range(1, n + 1):
        tracker.log_step(step, {"train/loss": 1.0 / step})


def recorder(out: Path, trackers: list[Guarded], resumed_at: int = 0) -> Tracker:
    tracker = Tracker(Stand(trackers), out)
    tracker.start("qa", {"lr": 1e-3}, resumed_at=resumed_at)
    return tracker


# --- failures never stop training --------------------------------------------------------------


@pytest.mark.usefixtures("no_credentials")
def test_start_failure_warns_once_and_files_are_still_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = install(monkeypatch, FakeWandb(init_error=PermissionError("no api key")))
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="wandb start failed, continuing without it: no api key"):
        tracker = recorder(out, [wandb_tracker(out)])
    assert len(fake.inits) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing more to warn about: W&B is simply off
        run_steps(tracker, 3)
        tracker.finish(metrics())
        tracker.close()
    assert [line["step"] for line in step_lines(out)] == [1, 2, 3]
    assert json.loads((out / "metrics.json").read_text()) == metrics().to_json()
    assert fake.run.logged == [] and fake.run.finished == 0


@pytest.mark.usefixtures("no_credentials")
def test_log_failure_disables_the_tracker_and_keeps_the_step_log(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = install(monkeypatch, FakeWandb(FakeRun(fail_log_on=2)))
    out = tmp_path / "run"
    tracker = recorder(out, [wandb_tracker(out)])
    with pytest.warns(UserWarning) as caught:
        run_steps(tracker, 5)
    assert [str(w.message) for w in caught] == ["wandb log failed, continuing without it: wandb backend went away"]
    assert [step for _, step in fake.run.logged] == [1, 2]  # nothing reached W&B after the failure
    assert [line["step"] for line in step_lines(out)] == [1, 2, 3, 4, 5]
    assert step_lines(out)[4] == {"step": 5, "train/loss": 0.2}
    tracker.finish(metrics())
    tracker.close()
    assert fake.run.summaries == [] and fake.run.finished == 0
    assert (out / "metrics.json").is_file()


@pytest.mark.usefixtures("no_credentials")
def test_summary_failure_warns_and_the_run_still_logs_and_ends(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = install(monkeypatch, FakeWandb(FakeRun(fail_summary=True)))
    out = tmp_path / "run"
    tracker = recorder(out, [wandb_tracker(out)])
    with pytest.warns(UserWarning, match="wandb summary failed: summary rejected"):
        tracker.finish(metrics())
    assert json.loads((out / "metrics.json").read_text()) == metrics().to_json()
    tracker.log_step(7, {"x": 1.0})  # not a fatal failure: the run is kept
    tracker.close()
    assert fake.run.logged[-1] == ({"x": 1.0, "train/global_step": 7}, 7)
    assert fake.run.finished == 1  # the run is still closed so it does not stay "running" in W&B


@pytest.mark.usefixtures("no_credentials")
def test_summary_is_flat_and_leaves_out_args_and_lists(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = install(monkeypatch, FakeWandb())
    tracker = recorder(tmp_path, [wandb_tracker(tmp_path)])
    tracker.finish(metrics())
    (summary,) = fake.run.summaries
    assert summary["eval/exact_match"] == 81.25 and summary["strategy"] == "zero2"
    assert "exact_match" not in summary and "f1" not in summary  # once, under the history's key
    assert summary["peak_memory_gb/max"] == 2.5 and summary["peak_memory_gb/mean"] == 2.0
    assert not [k for k in summary if k.startswith("args/") or k == "args"]
    assert "train_loss_per_rank" not in summary and "peak_memory_gb/per_rank" not in summary
    assert fake.run.finished == 0  # the export and its artifact still follow
    tracker.close()
    tracker.close()  # as accelerate's end_training does after ours: the run is not finished a second time
    assert fake.run.finished == 1


@pytest.mark.usefixtures("no_credentials")
def test_config_goes_to_the_run_and_a_config_failure_is_not_fatal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = install(monkeypatch, FakeWandb())
    fake.run.config = types.SimpleNamespace(
        update=lambda values, allow_val_change: (_ for _ in ()).throw(TypeError("bad value"))
    )
    with pytest.warns(UserWarning, match="wandb config failed: bad value"):
        tracker = recorder(tmp_path, [wandb_tracker(tmp_path)])
    run_steps(tracker, 1)
    assert fake.run.logged == [({"train/loss": 1.0, "train/global_step": 1}, 1)]


# --- W&B mode ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_credentials")
def test_offline_without_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = install(monkeypatch, FakeWandb())
    started(tmp_path, name="r1", group=None, resume=None, id=None)
    assert fake.inits == [
        {
            "project": "qa",
            "name": "r1",
            "mode": "offline",
            "dir": str(tmp_path),
            "group": None,
            "resume": None,
            "id": None,
        }
    ]


@pytest.mark.usefixtures("no_credentials")
def test_online_with_an_api_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    fake = install(monkeypatch, FakeWandb())
    tracker = started(tmp_path)
    (kw,) = fake.inits
    assert kw["mode"] == "online" and tracker.tracker is fake.run
    # wandb's own 90 s would hold every rank at the next collective; ours is a few seconds.
    assert kw["settings"].init_timeout == trackers.WANDB_INIT_TIMEOUT_S <= 10
    # ... and no "who am I" query to the server before it, which would add 2 x 5 s when it is down.
    assert [vars(s) for s in fake.setups] == [{"x_disable_viewer": True}]


class CommError(Exception):
    """Stands in for wandb.errors.CommError, what wandb.init raises when its init_timeout runs out."""


@pytest.mark.usefixtures("no_credentials")
def test_unreachable_server_falls_back_to_offline_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    fake = install(
        monkeypatch,
        FakeWandb(online_error=CommError("Run initialization has timed out after 5.0 sec.\nPlease try again.")),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fallback is not a failure: one log line, no warning
        tracker = recorder(tmp_path, [wandb_tracker(tmp_path, name="r1", id="abc123", resume="allow")])
    online, offline = fake.inits
    assert online["mode"] == "online" and offline["mode"] == "offline"
    # The same run: project, name, id and resume carry over to the offline one `wandb sync` uploads later.
    assert {k: v for k, v in online.items() if k not in ("mode", "settings")} == {
        k: v for k, v in offline.items() if k != "mode"
    }
    assert offline["id"] == "abc123" and offline["resume"] == "allow"
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line.startswith("W&B online run did not start (CommError: Run initialization has timed out after 5.0 sec.;")
    assert f"logging offline to {tmp_path / 'wandb'}" in line and "wandb sync" in line and "\n" not in line
    run_steps(tracker, 2)
    assert [step for _, step in fake.run.logged] == [1, 2]  # the offline run records the steps


@pytest.mark.usefixtures("no_credentials")
def test_wandb_init_timeout_from_the_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "42")
    fake = install(monkeypatch, FakeWandb())
    started(tmp_path)
    assert fake.inits[0]["settings"].init_timeout == 42.0


@pytest.mark.usefixtures("no_credentials")
def test_offline_fallback_failing_too_disables_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    fake = install(monkeypatch, FakeWandb(init_error=OSError("disk full"), online_error=CommError("timed out")))
    with pytest.warns(UserWarning, match="wandb start failed, continuing without it: disk full"):
        tracker = recorder(tmp_path, [wandb_tracker(tmp_path)])
    assert [kw["mode"] for kw in fake.inits] == ["online", "offline"]
    run_steps(tracker, 1)
    assert step_lines(tmp_path) == [{"step": 1, "train/loss": 1.0}]


@pytest.mark.usefixtures("no_credentials")
def test_no_second_init_when_offline_was_chosen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An offline (or disabled) mode never waits on a server, so it gets neither a timeout nor a retry."""
    fake = install(monkeypatch, FakeWandb(init_error=CommError("boom")))
    with pytest.warns(UserWarning, match="wandb start failed"):
        started(tmp_path)
    assert [kw["mode"] for kw in fake.inits] == ["offline"] and "settings" not in fake.inits[0]


@pytest.mark.usefixtures("no_credentials")
def test_online_with_a_netrc_entry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    netrc = tmp_path / "wandb.netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    monkeypatch.setenv("NETRC", str(netrc))
    fake = install(monkeypatch, FakeWandb())
    started(tmp_path / "run")
    assert fake.inits[0]["mode"] == "online" and len(fake.inits) == 1


@pytest.mark.usefixtures("no_credentials")
def test_wandb_mode_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    fake = install(monkeypatch, FakeWandb())
    started(tmp_path, group="sweep", job_type="zero2")
    (kw,) = fake.inits
    assert (kw["mode"], kw["group"], kw["job_type"]) == ("disabled", "sweep", "zero2")


@pytest.mark.usefixtures("no_credentials")
def test_report_to_none_never_imports_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = install(monkeypatch, FakeWandb())
    tracker = recorder(tmp_path, build_trackers([], tmp_path, "qa", {}))
    run_steps(tracker, 2)
    tracker.finish(metrics())
    tracker.close()
    assert fake.inits == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "train_log.jsonl"]


def test_a_tracker_that_is_not_installed_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("accelerate.tracking.get_available_trackers", lambda: ["wandb", "tensorboard"])
    with pytest.raises(
        ConfigError,
        match=r"^--report_to: mlflow not installed here \(installed: tensorboard, "
        r"wandb\); pip install it or leave it out$",
    ):
        build_trackers(["wandb", "mlflow"], tmp_path, "qa", {})


def test_config_names_every_accelerate_tracker() -> None:
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    assert set(TRACKERS) == set(LOGGER_TYPE_TO_CLASS)


@pytest.mark.parametrize(
    ("flag", "trackers_"),
    [
        ("wandb", ["wandb"]),
        ("all", ["wandb", "tensorboard"]),
        ("none", []),
        ("tensorboard, wandb", ["tensorboard", "wandb"]),
    ],
)
def test_report_to_names(flag: str, trackers_: list[str]) -> None:
    assert OutputArgs(report_to=flag).trackers == trackers_


@pytest.mark.parametrize(
    ("flag", "problem"),
    [("wandb,bogus", "bogus is not a tracker"), ("all,wandb", "all and none stand alone"), ("", "empty")],
)
def test_report_to_refuses(flag: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=f"^--report_to: .*{problem}"):
        OutputArgs(report_to=flag)


# --- what gets written -------------------------------------------------------------------------


@pytest.mark.usefixtures("no_credentials")
def test_a_non_main_rank_writes_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = install(monkeypatch, FakeWandb())
    out = tmp_path / "run"
    stand = Stand([wandb_tracker(out)], is_main=False)
    tracker = Tracker(stand, out)
    tracker.start("qa", {}, resumed_at=0)
    run_steps(tracker, 3)
    tracker.log_table("eval/samples", ["a"], [[1]], 3)
    tracker.finish(metrics())
    tracker.close()
    assert not out.exists()
    assert fake.inits == [] and fake.run.logged == [] and stand.configs == []


def test_a_non_main_rank_leaves_an_existing_step_log(tmp_path: Path) -> None:
    (tmp_path / "train_log.jsonl").write_text('{"step": 1}\n')
    Tracker(Stand([], is_main=False), tmp_path).start("qa", {}, resumed_at=0)
    assert (tmp_path / "train_log.jsonl").read_text() == '{"step": 1}\n'


@pytest.mark.parametrize("resumed_at", [0, 2])
def test_step_log_is_reset_unless_resuming(tmp_path: Path, resumed_at: int) -> None:
    (tmp_path / "train_log.jsonl").write_text('{"step": 1, "train/loss": 9.0}\n{"step": 3, "train/loss": 7.0}\n')
    tracker = recorder(tmp_path, [], resumed_at=resumed_at)
    tracker.log_step(3, {"train/loss": 0.5})
    expected = ([{"step": 1, "train/loss": 9.0}] if resumed_at else []) + [{"step": 3, "train/loss": 0.5}]
    assert step_lines(tmp_path) == expected  # the interrupted run's step 3 is gone, not logged twice


def test_a_torn_last_line_is_dropped_on_resume_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash in the middle of a write leaves half a line: the resume drops it and goes on."""
    log = tmp_path / "train_log.jsonl"
    log.write_text('{"step": 1, "train/loss": 9.0}\n{"step": 2, "train/loss": 8.0}\n{"step": 3, "train/lo')
    tracker = recorder(tmp_path, [], resumed_at=2)
    tracker.log_step(3, {"train/loss": 0.5})
    assert [r["step"] for r in step_lines(tmp_path)] == [1, 2, 3]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert f"{log}: line 3 " in warning


def test_read_step_log_skips_a_torn_last_line_and_refuses_a_bad_middle_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The one reader of train_log.jsonl for a run that may still be writing (the dashboard's)."""
    log = tmp_path / "train_log.jsonl"
    log.write_text('{"step": 1, "train/loss": 9.0}\n\n{"step": 2, "train/loss": 8.0}\n[3]\n')
    assert tracking.read_step_log(log) == [{"step": 1, "train/loss": 9.0}, {"step": 2, "train/loss": 8.0}]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"{log}: line 4 ")
    log.write_text('{"step": 1}\n{"step": 2, "tr\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r": line 2 is not JSON \("):
        tracking.read_step_log(log)
    log.write_text('{"step": 1}\n"step"\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r": line 2 is not a JSON record: '\"step\"'"):
        tracking.read_step_log(log)


def test_start_creates_the_output_dir(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    recorder(out, [])
    assert out.is_dir()


@pytest.mark.usefixtures("no_credentials")
def test_wandb_gets_the_config_nested_and_tensorboard_as_scalars(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = install(monkeypatch, FakeWandb())
    updates: list[dict] = []
    fake.run.config = types.SimpleNamespace(update=lambda values, allow_val_change: updates.append(values))
    board = build_trackers(["tensorboard"], tmp_path, "qa", {})[0]
    shown: list[dict] = []
    monkeypatch.setattr(board.inner, "store_init_configuration", shown.append)
    config = {"lr": 1e-3, "resume": None, "deepspeed_config": {"zero_optimization": {"stage": 3}}}
    tracker = Tracker(Stand([wandb_tracker(tmp_path), board]), tmp_path)
    tracker.start("qa", config, resumed_at=0)
    assert updates == [config]
    assert shown == [{"lr": 1e-3, "resume": "None", "deepspeed_config": "{'zero_optimization': {'stage': 3}}"}]


def test_tensorboard_events_hold_what_was_logged(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = recorder(tmp_path, build_trackers(["tensorboard"], tmp_path, "qa", {}))
    run_steps(tracker, 3)
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("train/loss")
    assert [(e.step, round(e.value, 4)) for e in scalars] == [(1, 1.0), (2, 0.5), (3, 0.3333)]


def test_a_full_disk_while_writing_metrics_json_names_it_and_leaves_no_temporary_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """write() fails with ENOSPC and no file name: the line said "No space left on device" alone, and
    .metrics.json.tmp stayed (issue 38, case 4)."""
    real_write = Path.write_text

    def full(self: Path, text: str, *args, **kwargs) -> int:
        real_write(self, text[:10], *args, **kwargs)  # the disk fills part-way
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError) as err:
        Tracker(Stand([]), tmp_path).finish(metrics(mfu=None))
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "metrics.json")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_while_appending_to_the_step_log_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An append to train_log.jsonl that meets a full disk raises ENOSPC without a file name: the exit-5 line said
    "No space left on device" alone (found by filling a real tmpfs while a tiny run logged every step)."""
    tracker = recorder(tmp_path, [])

    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "open", lambda self, *args, **kwargs: Full())
    with pytest.raises(OSError) as err:
        tracker.log_step(1, {"train/loss": 1.0})
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "train_log.jsonl")


def test_metrics_json_is_to_json_written_atomically(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text('{"old": true}')
    replaced: list[tuple[Path, Path]] = []
    real_replace = tracking.os.replace

    def spy(src: Path, dst: Path) -> None:
        replaced.append((Path(src), Path(dst)))
        assert json.loads(Path(dst).read_text()) == {"old": True}  # the old file is intact until the rename
        real_replace(src, dst)

    monkeypatch.setattr(tracking.os, "replace", spy)
    m = metrics(mfu=None, initial_exact_match=3.0)
    tracker = Tracker(Stand([]), tmp_path)
    tracker.finish(m)
    assert replaced == [(tmp_path / ".metrics.json.tmp", tmp_path / "metrics.json")]
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written == m.to_json()
    assert list(written) == list(m.to_json())  # key order is the schema's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
    assert RunMetrics.read(tmp_path) == m


# --- summary_table -----------------------------------------------------------------------------


def row(table: str, label: str) -> str:
    (line,) = [ln for ln in table.splitlines() if ln.startswith(label)]
    return line[len(label) :].strip()


def test_summary_table_shows_strategy_and_scores() -> None:
    table = summary_table(metrics())
    assert row(table, "strategy") == "zero2 (zero_stage=2, offload=none), world_size=2, bf16"
    assert row(table, "exact match / F1") == "81.25 / 88.50"
    assert row(table, "peak memory") == "max 2.50 GiB / mean 2.00 GiB per rank [n/a]"


def test_summary_table_shows_untrained_scores_when_measured() -> None:
    table = summary_table(metrics(initial_exact_match=0.5, initial_f1=4.25))
    assert row(table, "exact match / F1") == "81.25 / 88.50  (untrained: EM 0.50, F1 4.25)"


def test_summary_table_says_na_for_missing_values() -> None:
    table = summary_table(RunMetrics(strategy="ddp", world_size=1, mfu=math.nan))
    assert row(table, "exact match / F1") == "n/a / n/a"
    assert row(table, "throughput") == "n/a samples/s, n/a tokens/s (n/a padded)"
    assert row(table, "step time") == "n/a, MFU n/a"
    assert row(table, "peak memory").startswith("max n/a / mean n/a per rank")
    assert "untrained" not in table


def interrupted(out: Path, run_id: str, logged: list[int]) -> FakeRun:
    """An output dir as a run killed after logging `logged` leaves it (its W&B run's folder included), and the
    W&B run a resumed run with `run_id` gets."""
    out.mkdir(parents=True)
    (out / "train_log.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": 1.0}) + "\n" for s in logged))
    (out / "wandb" / f"offline-run-20260101_000000-{run_id}").mkdir(parents=True)
    run = FakeRun()
    run.id, run.dir = run_id, str(out / "wandb" / f"offline-run-20260102_000000-{run_id}" / "files")
    return run


def board_steps(out: Path, key: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    return [e.step for e in events.Scalars(key)]


@pytest.mark.usefixtures("no_credentials")
def test_a_resumed_run_sends_its_wandb_run_no_step_that_run_already_holds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """WANDB_RUN_ID across a SLURM requeue: the killed run logged up to step 15, its checkpoint is at 10. W&B
    drops a step below its run's last (a warning each, and the value is lost); before, the resumed run sent
    steps 10 and 15 again."""
    out = tmp_path / "run"
    fake = install(monkeypatch, FakeWandb(interrupted(out, "job-42", [5, 10, 15])))
    fake.Table = lambda columns, data: ("table", columns, data)
    tracker = recorder(
        out,
        [wandb_tracker(out, id="job-42", resume="allow"), build_trackers(["tensorboard"], out, "qa", {})[0]],
        resumed_at=10,
    )
    tracker.log_step(10, {"eval/f1": 50.0})  # the evaluation the checkpoint owed
    for step in (15, 20):
        tracker.log_step(step, {"train/loss": 0.5})
    tracker.log_table("eval/samples", ["id"], [["q1"]], 20)
    tracker.close()
    assert [step for _, step in fake.run.logged] == [20, 20]  # the step and the table, nothing backwards
    assert board_steps(out, "train/loss") == [15, 20] and board_steps(out, "eval/f1") == [10]
    assert [(r["step"], sorted(r)) for r in step_lines(out)] == [
        (5, ["step", "train/loss"]),
        (10, ["step", "train/loss"]),
        (10, ["eval/f1", "step"]),
        (15, ["step", "train/loss"]),
        (20, ["step", "train/loss"]),
    ]
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert line.startswith("W&B run job-42 already holds steps up to 15 (logged by the interrupted run with this id)")
    assert "resumed at step 10, sends W&B only its steps after 15" in line


@pytest.mark.usefixtures("no_credentials")
def test_a_resumed_run_under_a_new_wandb_id_sends_every_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No WANDB_RUN_ID: the resumed run is a new W&B run, whose steps start at the checkpoint's."""
    out = tmp_path / "run"
    run = interrupted(out, "first", [5, 10, 15])
    run.id, run.dir = "second", str(out / "wandb" / "offline-run-20260102_000000-second" / "files")
    fake = install(monkeypatch, FakeWandb(run))
    tracker = recorder(out, [wandb_tracker(out, resume="allow")], resumed_at=10)
    tracker.log_step(10, {"eval/f1": 50.0})
    tracker.log_step(15, {"train/loss": 0.5})
    assert [step for _, step in fake.run.logged] == [10, 15]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.usefixtures("no_credentials")
def test_an_online_resumed_wandb_run_takes_steps_from_where_wandb_says_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Online, W&B itself says where the run it resumed stands, also without its folder here."""
    run = FakeRun()
    run.id, run.resumed, run.starting_step = "job-42", True, 13
    fake = install(monkeypatch, FakeWandb(run))
    tracker = recorder(tmp_path, [wandb_tracker(tmp_path, id="job-42", resume="allow")], resumed_at=10)
    for step in (10, 12, 13, 14):
        tracker.log_step(step, {"train/loss": 0.5})
    assert [step for _, step in fake.run.logged] == [13, 14]


def test_a_fresh_run_sends_every_step_even_beside_an_old_wandb_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    install(monkeypatch, FakeWandb(interrupted(tmp_path / "run", "job-42", [5, 10])))
    tracker = recorder(tmp_path / "run", [wandb_tracker(tmp_path / "run", id="job-42")], resumed_at=0)
    assert tracker.wandb_floor == 0


def test_the_last_logged_step_ignores_a_torn_line_and_a_missing_log(tmp_path: Path) -> None:
    log = tmp_path / "train_log.jsonl"
    assert tracking.forget_steps_after(log, 10) == 0
    log.write_text('{"step": 5}\n{"step": 15, "eval/f1": 1.0}\n{"step": 10}\n{"step": 20, "tr')
    assert tracking.forget_steps_after(log, 10) == 15


# --- the model artifact ------------------------------------------------------------------------------


class FakeArtifact:
    def __init__(self, name: str, type: str, metadata: dict) -> None:  # noqa: A002 - wandb's own argument name
        self.name, self.type, self.metadata, self.dirs = name, type, metadata, []

    def add_dir(self, path: str) -> None:
        self.dirs.append(path)


@pytest.mark.usefixtures("no_credentials")
@pytest.mark.parametrize(
    ("exported", "scores"), [(30, {"exact_match": 81.25, "f1": 88.5}), (20, {"exact_match": 84.0, "f1": 90.0})]
)
def test_model_artifact_has_a_valid_name_and_says_which_model_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, exported: int, scores: dict
) -> None:
    """--run_name (by default the output dir's name) may hold characters W&B refuses in an artifact name: the
    artifact was lost with a warning. With --save_best the export may be an earlier step's model."""
    fake = install(monkeypatch, FakeWandb())
    fake.Artifact = FakeArtifact
    logged: list[tuple[FakeArtifact, list[str]]] = []
    fake.run.log_artifact = lambda art, aliases: logged.append((art, aliases))
    tracker = recorder(tmp_path, [wandb_tracker(tmp_path)])
    tracker.finish(metrics(best_eval_step=20, best_exact_match=84.0, best_f1=90.0, exported_step=exported))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tracker.log_model(tmp_path / "final", "model-my run/1: é")
    ((art, aliases),) = logged
    assert art.name == "model-my-run-1-" and art.type == "model" and aliases == ["final"]
    assert art.dirs == [str(tmp_path / "final")]
    assert art.metadata == {"path": str(tmp_path / "final"), "step": exported, **scores}


def test_artifact_names_pass_wandbs_own_check() -> None:
    import wandb

    for name in ("model-my run/1", "model-" + "x" * 200, "model-ok_1.2-3", "model-é"):
        wandb.Artifact(tracking.artifact_name(name), type="model")  # raises ValueError on a name it refuses
    assert tracking.artifact_name("model-ok_1.2-3") == "model-ok_1.2-3"


# --- the summary, as W&B and the end-of-run table show it ---------------------------------------------------


@pytest.mark.usefixtures("no_credentials")
def test_summary_has_the_same_keys_with_and_without_per_rank_figures(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On CPU peak_memory_reserved_gb has no figures: the summary leaves them out (it holds no null), and has every
    other key a GPU run's has; per_rank lists are left out on both."""
    fake = install(monkeypatch, FakeWandb())
    tracker = recorder(tmp_path, [wandb_tracker(tmp_path)])
    tracker.finish(metrics(peak_memory_reserved_gb=PerRank()))
    tracker.finish(metrics(peak_memory_reserved_gb=PerRank.of([1.0, 2.0])))
    cpu, gpu = fake.run.summaries
    reserved = {"peak_memory_reserved_gb/max", "peak_memory_reserved_gb/mean"}
    assert set(gpu) - set(cpu) == reserved and set(cpu) <= set(gpu)
    assert not [k for k in cpu if k.endswith("per_rank")] and None not in cpu.values()
    assert gpu["peak_memory_reserved_gb/max"] == 2.0
    assert json.loads((tmp_path / "metrics.json").read_text())["peak_memory_reserved_gb"]["per_rank"] == [1.0, 2.0]


def test_a_run_of_no_step_says_so_instead_of_timings() -> None:
    """--max_train_steps 0 (evaluate and export the model as built): no throughput, step time or training memory
    exists, where the table printed three lines of n/a."""
    table = summary_table(metrics(train_steps=0, train_samples_per_second=None, mfu=None))
    assert row(table, "training") == "no step (--max_train_steps 0): nothing to time"
    assert not any(line.startswith(("throughput", "step time", "peak memory")) for line in table.splitlines())
    assert row(table, "exact match / F1") == "81.25 / 88.50" and row(table, "peak host RSS").startswith("max ")


def test_summary_table_shows_every_missing_value_as_na() -> None:
    table = summary_table(RunMetrics(strategy="ddp", world_size=1))
    assert "None" not in table
    assert row(table, "strategy") == "ddp (zero_stage=n/a, offload=n/a), world_size=1, n/a"
    assert row(table, "train steps") == "n/a x global batch n/a (n/a windows of n/a max)"
    assert row(table, "peak memory") == "max n/a / mean n/a per rank [n/a]"
    assert row(table, "output") == "n/a"


def test_summary_table_units_step_time_and_mfu() -> None:
    """A 4 ms step read "0.00 s"; MFU is a fraction in metrics.json and a percentage on screen."""
    table = summary_table(
        metrics(train_step_time_s_mean=0.00412, mfu=0.4123, num_train_features=88000, max_seq_length=384)
    )
    assert row(table, "step time") == "0.0041 s, MFU 41.2%"
    assert row(table, "train steps") == "30 x global batch 16 (88,000 windows of 384 max)"
    width = len("exact match / F1")  # the longest label
    rows = table.splitlines()[1:-1]
    assert all(line[width : width + 2] == "  " and line[width + 2] != " " for line in rows), "values in one column"


def test_summary_table_says_how_much_of_training_was_checkpoint_saves() -> None:
    assert row(summary_table(metrics(train_runtime_s=120.0, total_runtime_s=150.0)), "runtime") == (
        "120.00 s training, 150.00 s total"
    )
    table = summary_table(metrics(train_runtime_s=120.0, checkpoint_runtime_s=9.5, total_runtime_s=150.0))
    assert row(table, "runtime") == "120.00 s training (9.50 s of it checkpoints), 150.00 s total"
