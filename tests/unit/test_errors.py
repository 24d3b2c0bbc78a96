"""qa_train.core.errors: the one line every refusal and failure shows for a library's error."""

from __future__ import annotations

from qa_train.core.errors import one_line


def test_a_multi_line_message_is_its_type_and_first_line_with_spaces_collapsed() -> None:
    err = OSError("  Can't load   the config for 'x'.\n\nIf you were trying to load it from the hub ...\n")
    assert one_line(err) == "OSError: Can't load the config for 'x'."


def test_a_long_line_is_cut_at_the_limit_and_marked() -> None:
    text = one_line(ValueError("y" * 500), limit=50)
    assert text == "ValueError: " + "y" * 38 + "..." and len(text) == 53


def test_an_error_without_a_message_is_its_type() -> None:
    assert one_line(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert one_line(RuntimeError("   \n  ")) == "RuntimeError"


def test_divergence_remedies_leave_out_what_the_run_already_does() -> None:
    from qa_train.trainer import divergence_remedies

    assert divergence_remedies(1.0, "bf16") == "a lower --learning_rate or more warm-up (--warmup_ratio 0.1)"
    assert divergence_remedies(0.0, "fp16") == (
        "a lower --learning_rate, more warm-up (--warmup_ratio 0.1), --max_grad_norm 1.0, or bf16 instead of fp16"
    )


def test_the_hung_rank_line_faults_md_quotes_is_the_one_main_prints() -> None:
    """faults.md quoted a rerun advice (--overwrite_output_dir) that _hung never gives: a featurisation hang
    reproduced with SIGSTOP on rank 0 printed --resume_from_checkpoint latest."""
    from pathlib import Path

    from qa_train.__main__ import _hung

    line = _hung(RuntimeError("timeout"), 1, 2)
    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "faults.md").read_text().split())
    assert line.removeprefix("rank 1: a collective") in doc
