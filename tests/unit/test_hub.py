"""qa_train.data.hub: a hub dataset, or a local folder in the hub's layout, read as qa_train's examples; every failure
of datasets or the hub one line naming the flag."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import DEMO_DEV, DEMO_TRAIN
from hub_folders import hub_download

from qa_train.data.hub import HubDataset, looks_local, refusal
from qa_train.data.load import DataError, load_file, load_split


@pytest.fixture(scope="module", autouse=True)
def datasets_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """datasets caches a local folder under its base name: these `squad` folders must not become the machine's
    cached squad."""
    import datasets.config

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf-datasets"))
        yield


@pytest.fixture(scope="module")
def downloaded(tmp_path_factory: pytest.TempPathFactory) -> HubDataset:
    return HubDataset(str(hub_download(tmp_path_factory.mktemp("hub") / "squad")))


def test_a_downloaded_hub_folder_reads_as_the_files_it_was_made_from(downloaded: HubDataset) -> None:
    for split, path in (("train", DEMO_TRAIN), ("validation", DEMO_DEV)):
        from_folder, from_file = load_split(None, downloaded, split, None), load_file(path)
        assert from_folder.ids == from_file.ids and from_folder.answer_starts == from_file.answer_starts
        assert from_folder.contexts == from_file.contexts and from_folder.source == f"{downloaded.name}[{split}]"
    named = HubDataset(downloaded.name, "plain_text")  # the config its README names
    assert len(load_split(None, named, "validation", 7)) == 7


def test_a_copied_folder_is_the_same_data_and_an_edited_one_is_not(downloaded: HubDataset, tmp_path) -> None:
    """A copy elsewhere (a job staging its data on node-local disk) is the same data, whatever its paths and times.
    An edited folder was not other data: datasets' cache served its old records under the old fingerprint."""
    import shutil

    import datasets

    copy = tmp_path / "node-local" / "squad"
    shutil.copytree(downloaded.name, copy, copy_function=shutil.copy)  # new paths, new times, same bytes
    (copy / ".cache").mkdir()  # huggingface-cli's download metadata, which holds times
    (copy / ".cache" / "download.metadata").write_text("1764300000.0")
    for split in ("train", "validation"):
        assert load_split(None, HubDataset(str(copy)), split, None).fingerprint == (
            load_split(None, downloaded, split, None).fingerprint
        )
    assert load_split(None, downloaded, "train", None).fingerprint != (
        load_split(None, downloaded, "validation", None).fingerprint
    )
    parquet = copy / "plain_text" / "validation-00000-of-00001.parquet"
    records = datasets.Dataset.from_parquet(str(parquet)).to_list()
    records[0]["question"] += " Really?"
    datasets.Dataset.from_list(records).to_parquet(str(parquet))
    edited, original = (load_split(None, d, "validation", None) for d in (HubDataset(str(copy)), downloaded))
    assert edited.questions[0] == original.questions[0] + " Really?"  # datasets' cache served the old one
    assert edited.fingerprint != original.fingerprint


def test_save_to_disks_folder_reads_through_load_from_disk(downloaded: HubDataset, tmp_path) -> None:
    import datasets

    saved = tmp_path / "squad-saved"
    datasets.load_dataset(downloaded.name).save_to_disk(str(saved))
    examples = load_split(None, HubDataset(str(saved)), "validation", None)
    assert examples.ids == load_file(DEMO_DEV).ids
    with pytest.raises(
        DataError, match=r"^--dataset_config_name plain_text: .* is save_to_disk's output, which has no"
    ):
        load_split(None, HubDataset(str(saved), "plain_text"), "train", None)
    with pytest.raises(
        DataError, match=r"has no 'test' split \(it has train, validation\); give that split as a local"
    ):
        load_split(None, HubDataset(str(saved)), "test", None)


@pytest.mark.parametrize(
    ("config", "split", "says"),
    [
        ("nope", "train", r"^--dataset_config_name nope: .*squad has no such config .*Available: \['plain_text'\]"),
        (None, "test", r"^--dataset_name .*squad: has no 'test' split \(it has train, validation\)"),
    ],
)
def test_a_wrong_config_or_split_names_its_flag(downloaded: HubDataset, config, split: str, says: str) -> None:
    with pytest.raises(DataError, match=says) as err:
        load_split(None, HubDataset(downloaded.name, config), split, None)
    assert "\n" not in str(err.value)


def test_a_folder_without_the_validation_split_says_which_flag_gives_it(tmp_path) -> None:
    train_only = HubDataset(str(hub_download(tmp_path / "squad", splits=("train",))))
    with pytest.raises(
        DataError, match=r"has no 'validation' split \(it has train\); give that split as --validation_file"
    ):
        load_split(None, train_only, "validation", None)


def test_a_mistyped_folder_is_refused_before_datasets_is_asked(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets was asked"))
    with pytest.raises(DataError, match=r"^--dataset_name ./squad-local: no such folder"):
        load_split(None, HubDataset("./squad-local"), "train", None)
    with pytest.raises(DataError, match=r"is a file, not a dataset folder"):
        load_split(None, HubDataset(str(DEMO_DEV)), "train", None)
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    assert looks_local("data/squad") and not looks_local("rajpurkar/squad") and not looks_local("squad")


def test_the_hub_off_is_one_line_that_says_how_to_prepare_the_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """datasets, offline, with squad not cached: a ConnectionError and 34 lines of traceback before."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError) as err:
        load_split(None, HubDataset("qa-train-tests/no-such-squad"), "train", None)
    assert str(err.value).startswith("--dataset_name qa-train-tests/no-such-squad: cannot be loaded with the hub off")
    assert "docs/training.md" in str(err.value) and "--train_file" in str(err.value)


def test_each_hub_failure_becomes_its_flags_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failures no test can provoke without a network, as datasets raises them."""
    from datasets.exceptions import DatasetNotFoundError

    for variable in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    squad = HubDataset("rajpurkar/squad", "plain_text")
    gated = DatasetNotFoundError("Dataset 'rajpurkar/squad' is a gated dataset on the Hub. You must be authenticated")
    assert refusal(gated, squad, "train") == (
        "--dataset_name rajpurkar/squad: a gated dataset; accept its terms at huggingface.co/datasets/rajpurkar/squad "
        "and pass --token (or set HF_TOKEN)"
    )
    missing = DatasetNotFoundError("Dataset 'rajpurkar/squad' doesn't exist on the Hub or cannot be accessed.")
    assert refusal(missing, squad, "train").startswith("--dataset_name rajpurkar/squad: not on the hub, or private")
    down = ConnectionError("Couldn't reach 'rajpurkar/squad' on the Hub (ConnectError)")
    assert refusal(down, squad, "train").startswith("--dataset_name rajpurkar/squad: the hub cannot be reached")
    several = ValueError("Config name is missing.\nPlease pick one among the available configs: ['a', 'b']")
    assert refusal(several, HubDataset("x/y"), "train").startswith("--dataset_config_name: x/y has several configs")
    script = RuntimeError("Dataset scripts are no longer supported, but found squad.py")
    assert refusal(script, squad, "train") == (
        "--dataset_name rajpurkar/squad: cannot be loaded (RuntimeError: Dataset scripts are no longer supported, "
        "but found squad.py)"
    )


def test_cache_dir_and_token_reach_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    from qa_train.config.flags import parse_args
    from qa_train.data.splits import load_splits

    asked = []

    def load_dataset(*args, **kwargs):
        asked.append((args, kwargs))
        raise ConnectionError("stop here")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    args = parse_args(["--dataset_name", "org/set", "--cache_dir", "/tmp/c", "--token", "hf_x", "--output_dir", "o"])
    with pytest.raises(DataError, match="^--dataset_name org/set: "):
        load_splits(args)
    assert asked == [(("org/set", None), {"split": "train", "cache_dir": "/tmp/c", "token": "hf_x"})]


def test_an_uncached_config_offline_names_the_config_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, datasets falls back on the cache and fails on a config it never saw: a ValueError before."""
    err = ValueError("Couldn't find cache for squad for config 'nope'")
    line = refusal(err, HubDataset("squad", "nope"), "train")
    assert line.startswith("--dataset_config_name nope: squad is cached without that config and the hub is off")


def test_a_hub_failure_is_the_only_line_on_stderr(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, datasets warns about the cached version it falls back on before failing: that warning does not
    precede the refusal. (datasets' handler holds the stderr of its import, which pytest's capture does not see:
    a handler of the test's own on its logger counts the records instead.)"""
    import logging

    import datasets

    datasets.load_dataset(str(hub_download(tmp_path / "squad", splits=("train",))))  # cached as `squad`
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    logging.getLogger("datasets").addHandler(handler)
    try:
        with pytest.raises(DataError, match=r"^--dataset_name squad: has no 'validation' split \(it has train\)"):
            load_split(None, HubDataset("squad"), "validation", None)
    finally:
        logging.getLogger("datasets").removeHandler(handler)
    assert [r.getMessage() for r in seen] == []
    assert datasets.logging.get_verbosity() == datasets.logging.WARNING, "datasets' level is given back"
