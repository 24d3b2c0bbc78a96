"""The command line starts without importing `evaluate`: only qa_train.squad.metric pays for it."""

from __future__ import annotations

import subprocess
import sys


def test_qa_train_does_not_import_evaluate() -> None:
    """Only qa_train.squad.metric pays for evaluate's import; the CLI must start fast."""
    code = (
        "import sys, qa_train, qa_train.__main__, qa_train.squad.scoring; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'evaluate'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
