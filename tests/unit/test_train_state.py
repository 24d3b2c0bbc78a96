"""The resume contract on plain TrainerStates: which changes a resumed run is refused, and which it is told."""

from __future__ import annotations

import pytest

from qa_train.strategy.train_state import DATA_ORDER, TrainerState, resume_conflicts


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


def test_another_world_size_is_refused() -> None:
    refusals, notes = resume_conflicts(contract(), contract(world_size=4, global_batch_size=128))
    assert refusals[0] == (
        "it was written by 2 processes, this run has 4: its optimizer, RNG and data-position state "
        "and its LR schedule are sized for 2; resume with 2 processes, or start a new run with "
        "--overwrite_output_dir"
    )
    assert refusals[1].startswith("its global batch is 64, this run's is 128: ")
    assert notes == []


def test_another_global_batch_is_refused() -> None:
    refusals, _ = resume_conflicts(contract(), contract(gradient_accumulation_steps=8, global_batch_size=128))
    assert refusals == [
        "its global batch is 64, this run's is 128: the steps done and the LR schedule count batches "
        "of 64; resume with per-device batch x accumulation x processes = 64, or start a new run with "
        "--overwrite_output_dir"
    ]


def test_another_total_is_a_note() -> None:
    assert resume_conflicts(contract(), contract(total_steps=150)) == (
        [],
        ["total steps 100 -> 150: the LR schedule is recomputed for 150 steps, so the learning rate jumps at step 40"],
    )
    _, notes = resume_conflicts(contract(), contract(total_steps=30))
    assert notes[0].endswith("; the checkpoint is already at step 40, so no training step runs")


def test_another_split_of_the_same_global_batch_at_an_epoch_boundary_is_a_note() -> None:
    now = contract(per_device_train_batch_size=16, gradient_accumulation_steps=2)
    assert resume_conflicts(contract(), now) == (
        [],
        [
            "batches 8 per device x 4 accumulation -> 16 x 2 with the same global batch 64: the checkpoint is at an epoch "
            "boundary, so no example is skipped or repeated; updates match in expectation, not bit for bit"
        ],
    )


def test_another_split_mid_epoch_is_refused() -> None:
    saved = contract(batches_in_epoch=12)
    now = contract(per_device_train_batch_size=16, gradient_accumulation_steps=2)
    assert resume_conflicts(saved, now) == (
        [
            "its batches were 8 per device x 4 accumulation, this run's are 16 x 2: it stopped 12 micro-batches into "
            "epoch 1, and skipping that many of another size would see examples twice or never; resume with "
            "--per_device_train_batch_size 8 --gradient_accumulation_steps 4"
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


def test_unknown_fields_are_skipped() -> None:
    old = TrainerState(completed_steps=40)
    assert resume_conflicts(old, contract(world_size=8)) == ([], [])
    assert resume_conflicts(contract(), TrainerState()) == ([], [])


def test_another_checkpoint_layout_is_refused_before_loading() -> None:
    """A DDP checkpoint resumed under FSDP crashed in torch.distributed.checkpoint, an FSDP one under DDP or ZeRO
    failed with "FileNotFoundError ... pytorch_model.bin" or a bare AssertionError, and FSDP's sharded files under
    its full-state-dict type hung (rank 0 failed while rank 1 waited in a broadcast)."""
    saved = contract(checkpoint_layout="FSDP sharded_state_dict files")
    refusals, _ = resume_conflicts(saved, contract(checkpoint_layout="FSDP full_state_dict files"))
    assert refusals == [
        "it was saved as FSDP sharded_state_dict files, this run loads FSDP full_state_dict files: "
        "each strategy writes its own files; resume under the accelerate config that wrote it, or "
        "start a new run with --overwrite_output_dir"
    ]
    assert resume_conflicts(saved, contract(checkpoint_layout="FSDP sharded_state_dict files")) == ([], [])
    assert resume_conflicts(contract(), saved) == ([], [])  # a checkpoint from before the field: unknown, skipped


def test_another_model_shape_is_refused_as_such_before_loading() -> None:
    """Resuming under another model config said the checkpoint "could not be loaded ... if it is damaged, resume
    from the previous checkpoint", which fails the same way (issue 38, case 7)."""
    narrow, wide = (f"bert, hidden_size {h}, num_hidden_layers 2" for h in (128, 256))
    assert resume_conflicts(contract(model_shape=narrow), contract(model_shape=wide))[0] == [
        f"it is a checkpoint of another model shape ({narrow}; this run builds {wide}): resume with the --config_name "
        "or --model_name_or_path that wrote it, or start a new run with --overwrite_output_dir"
    ]
    assert resume_conflicts(contract(), contract(model_shape=narrow)) == ([], [])  # unknown before the field: skipped
