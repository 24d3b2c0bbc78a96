"""The resume contract on plain TrainerStates: which changes a resumed run is refused, and which it is told."""

from __future__ import annotations

import json

import pytest

from qa_train.strategy.train_state import (
    CHECKPOINT_FORMAT,
    DATA_ORDER,
    NewerCheckpoint,
    TrainerState,
    continue_at,
    kept_accumulation,
    other_questions,
    resume_conflicts,
    state_from_json,
)


def test_fresh_states_get_distinct_run_ids() -> None:
    a, b = TrainerState(), TrainerState()
    assert a.run_id != b.run_id and len(a.run_id) == 32 and int(a.run_id, 16) >= 0


def contract(**changes) -> TrainerState:
    base = {
        "completed_steps": 40,
        "epoch": 1,
        "batches_in_epoch": 0,
        "world_size": 2,
        "global_batch_size": 64,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 4,
        "total_steps": 100,
    }
    return TrainerState(**{**base, **changes})


def test_the_same_contract_resumes_quietly() -> None:
    assert resume_conflicts(contract(), contract()) == ([], [])


def test_another_world_size_with_the_same_global_batch_continues_and_says_what_is_not_carried() -> None:
    now = contract(world_size=1, gradient_accumulation_steps=8)
    assert resume_conflicts(contract(), now) == (
        [],
        [
            "it was written by 2 processes, this run has 1, with the same global batch of 64: every step trains the "
            "windows it would have; per-rank RNG (dropout masks) is not carried"
        ],
    )


def test_another_world_size_with_another_global_batch_is_refused_naming_the_flag() -> None:
    refusals, notes = resume_conflicts(contract(), contract(world_size=4, global_batch_size=128))
    assert refusals == [
        "its global batch is 64, this run's is 128: the steps done and the LR schedule count batches of 64; resume "
        "with per-device batch x accumulation x processes = 64, add --allow_global_batch_change to continue with 128 "
        "(the steps and the schedule recomputed from the windows trained), or start a new run with "
        "--overwrite_output_dir"
    ]
    assert notes == []


def test_another_global_batch_is_refused_unless_allowed() -> None:
    now = contract(gradient_accumulation_steps=8, global_batch_size=128)
    refusals, _ = resume_conflicts(contract(), now)
    assert len(refusals) == 1 and refusals[0].startswith("its global batch is 64, this run's is 128: ")
    assert "add --allow_global_batch_change to continue with 128" in refusals[0]
    assert resume_conflicts(contract(), now, allow_global_batch_change=True) == ([], [])


def test_another_total_is_a_note() -> None:
    assert resume_conflicts(contract(), contract(total_steps=150)) == (
        [],
        ["total steps 100 -> 150: the LR schedule is recomputed for 150 steps, so the learning rate jumps at step 40"],
    )
    _, notes = resume_conflicts(contract(), contract(total_steps=30))
    assert notes[0].endswith("; the checkpoint is already at step 40, so no training step runs")


@pytest.mark.parametrize("batches_in_epoch", [0, 12])
def test_another_split_of_the_same_global_batch_is_a_note_at_a_boundary_and_mid_epoch(batches_in_epoch: int) -> None:
    """The windows consumed are skipped by count, not by micro-batches: another split trains the same windows."""
    now = contract(per_device_train_batch_size=16, gradient_accumulation_steps=2)
    assert resume_conflicts(contract(batches_in_epoch=batches_in_epoch), now) == (
        [],
        [
            "batches 8 per device x 4 accumulation -> 16 x 2 with the same global batch 64: every step trains the "
            "windows it would have (its update agrees to rounding)"
        ],
    )


def test_another_split_mid_epoch_is_refused_when_grouped_by_length() -> None:
    """The length-grouped order sorts runs of per-device batches: another size reorders the skipped windows."""
    saved = contract(batches_in_epoch=12, group_by_length=True)
    now = contract(per_device_train_batch_size=16, gradient_accumulation_steps=2, group_by_length=True)
    assert resume_conflicts(saved, now) == (
        [
            "its batches were 8 per device x 4 accumulation, this run's are 16 x 2: it stopped 12 micro-batches into "
            "epoch 1, and --group_by_length orders the windows by runs of per-device batches, so another size would "
            "see windows twice or never; resume with --per_device_train_batch_size 8 --gradient_accumulation_steps 4"
        ],
        [],
    )


@pytest.mark.parametrize(
    ("change", "fix"),
    [
        ({"seed": 7}, "--seed 42"),
        ({"group_by_length": True}, "--group_by_length False"),
        ({"num_train_windows": 900}, "the checkpoint's training data and windowing"),
        ({"train_data": "4f0c"}, "the checkpoint's training data and windowing"),  # same count, other windows
    ],
)
def test_another_window_order_mid_epoch_is_refused_and_at_a_boundary_noted(change: dict, fix: str) -> None:
    """A mid-epoch resume replays the epoch's order and skips what was consumed: another seed, grouping or set
    of windows would train some windows twice and others never."""
    order = {"seed": 42, "group_by_length": False, "num_train_windows": 1000, "train_data": "9ab1"}
    refusals, notes = resume_conflicts(contract(batches_in_epoch=12, **order), contract(**{**order, **change}))
    [name] = change
    assert notes == [] and len(refusals) == 1 and "12 micro-batches into epoch 1" in refusals[0]
    assert refusals[0].startswith(DATA_ORDER[name][0]) and f"resume with {fix}" in refusals[0]
    refusals, notes = resume_conflicts(contract(**order), contract(**{**order, **change}))
    assert refusals == [] and notes[0].endswith("at an epoch boundary: later epochs follow the new order")


def test_other_evaluation_questions_are_noted_as_not_compared_with_the_best_so_far() -> None:
    """The best F1 of other questions is no measure for this run's: carried silently, it stayed metrics.json's
    best_* (and --save_best's choice) although the resumed run scored other questions."""
    best = {"step": 20, "exact_match": 40.0, "f1": 51.234}
    saved = contract(eval_data="9ab1", best_eval=best)
    assert not other_questions(saved, contract(eval_data="9ab1"))
    assert other_questions(saved, contract(eval_data="4f0c"))
    assert resume_conflicts(saved, contract(eval_data="4f0c")) == (
        [],
        [
            "the evaluation questions changed (fingerprint 9ab1 -> 4f0c): the best evaluation so far (step 20, "
            "F1 51.23) scored the others, so metrics.json's best_* and --save_best count only this run's evaluations"
        ],
    )
    for unknown in (contract(best_eval=best), contract(eval_data=None)):  # an older checkpoint, a run without eval
        assert not other_questions(unknown, contract(eval_data="4f0c")) and not other_questions(saved, unknown)
    assert resume_conflicts(contract(eval_data="9ab1"), contract(eval_data="4f0c")) == ([], [])  # no best to lose
    counters = '"completed_steps": 1, "epoch": 0, "batches_in_epoch": 0'
    assert state_from_json(f'{{{counters}, "eval_data": "9ab1"}}').eval_data == "9ab1"
    with pytest.raises(ValueError, match="eval_data is 7, not a string"):
        state_from_json(f'{{{counters}, "eval_data": 7}}')


def test_unknown_fields_are_skipped() -> None:
    old = TrainerState(completed_steps=40)
    assert resume_conflicts(old, contract(world_size=8)) == ([], [])
    assert resume_conflicts(contract(), TrainerState()) == ([], [])


def test_another_checkpoint_layout_is_no_refusal() -> None:
    """Another strategy's files are converted (qa_train.strategy.checkpoint.conversion_reason): they used to be
    refused here, as a DDP checkpoint under FSDP crashed in torch.distributed.checkpoint and FSDP's sharded files
    under its full-state-dict type hung."""
    saved = contract(checkpoint_layout="FSDP sharded_state_dict files")
    assert resume_conflicts(saved, contract(checkpoint_layout="DeepSpeed ZeRO-3 files")) == ([], [])
    assert resume_conflicts(contract(), saved) == ([], [])  # a checkpoint from before the field: unknown, skipped


def test_a_trainer_state_of_a_newer_format_says_so_before_its_unknown_keys() -> None:
    higher = CHECKPOINT_FORMAT + 1
    newer = f'{{"completed_steps": 1, "epoch": 0, "batches_in_epoch": 0, "checkpoint_format": {higher}, "shards": 4}}'
    with pytest.raises(
        NewerCheckpoint, match=rf"written by a newer qa_train \(version unknown, checkpoint format {higher}"
    ):
        state_from_json(newer)
    for older in range(1, CHECKPOINT_FORMAT + 1):  # format 2 recorded no answering settings: None, not a refusal
        current = f'{{"completed_steps": 1, "epoch": 0, "batches_in_epoch": 0, "checkpoint_format": {older}}}'
        assert state_from_json(current).checkpoint_format == older and state_from_json(current).answering is None


def test_the_answering_settings_are_an_object_or_nothing() -> None:
    counters = '"completed_steps": 1, "epoch": 0, "batches_in_epoch": 0'
    answering = {"max_seq_length": 96, "doc_stride": 64}
    assert state_from_json(f'{{{counters}, "answering": {json.dumps(answering)}}}').answering == answering
    with pytest.raises(ValueError, match=r"answering is \[96, 64\], not an object"):
        state_from_json(f'{{{counters}, "answering": [96, 64]}}')


@pytest.mark.parametrize(
    ("processes", "per_device", "kept"), [(1, 8, 8), (4, 8, 2), (8, 8, 1), (16, 8, None), (2, 6, None), (2, 16, 2)]
)
def test_the_accumulation_kept_for_another_number_of_processes(processes: int, per_device: int, kept) -> None:
    assert kept_accumulation(contract(), per_device, processes) == kept
    assert kept_accumulation(TrainerState(), 8, 1) is None, "a checkpoint that does not say its global batch"


def test_the_position_is_counted_in_windows_on_another_world_size_or_split() -> None:
    """12 micro-batches of 8 on 2 processes: 192 windows into the epoch, 3 steps of 64."""
    saved = contract(batches_in_epoch=12)
    one = continue_at(saved, contract(world_size=1, gradient_accumulation_steps=8), updates_per_epoch=10)
    assert (one.completed_steps, one.batches_in_epoch, one.note) == (40, 24, None)
    split = continue_at(
        saved, contract(world_size=4, per_device_train_batch_size=16, gradient_accumulation_steps=1), 10
    )
    assert (split.completed_steps, split.batches_in_epoch) == (40, 3)
    assert continue_at(TrainerState(completed_steps=5, batches_in_epoch=3), contract(), 10) == continue_at(
        TrainerState(completed_steps=5, batches_in_epoch=3), contract(world_size=4), 10
    ), "a checkpoint that does not say its sizes: as saved"


def test_another_global_batch_recounts_the_steps_from_the_windows_trained() -> None:
    """Step 40 of 64 windows, 192 windows into epoch 1 (10 updates of 64 an epoch): with 128, epoch 1 has 5 updates
    of 128; 192 windows are one step of 128 and 64 more, which are trained again."""
    saved = contract(batches_in_epoch=12)
    now = contract(gradient_accumulation_steps=8, global_batch_size=128, total_steps=50)
    at = continue_at(saved, now, updates_per_epoch=5)
    assert (at.completed_steps, at.batches_in_epoch) == (6, 8)
    assert at.note == (
        "global batch 64 -> 128 (--allow_global_batch_change): step 40 of 64 windows continues as step 6 of 128, "
        "192 windows into epoch 1 (its last 64 are trained again); the LR schedule is recomputed for 50 steps of 128"
    )
    smaller = continue_at(saved, contract(gradient_accumulation_steps=2, global_batch_size=32), updates_per_epoch=20)
    assert (smaller.completed_steps, smaller.batches_in_epoch) == (26, 12)
    assert "trained again" not in smaller.note


def test_another_model_shape_is_refused_as_such_before_loading() -> None:
    """Resuming under another model config said the checkpoint "could not be loaded ... if it is damaged, resume
    from the previous checkpoint", which fails the same way (issue 38, case 7)."""
    narrow, wide = (f"bert, hidden_size {h}, num_hidden_layers 2" for h in (128, 256))
    assert resume_conflicts(contract(model_shape=narrow), contract(model_shape=wide))[0] == [
        f"it is a checkpoint of another model shape ({narrow}; this run builds {wide}): resume with the --config_name "
        "or --model_name_or_path that wrote it, or start a new run with --overwrite_output_dir"
    ]
    assert resume_conflicts(contract(), contract(model_shape=narrow)) == ([], [])  # unknown before the field: skipped
