"""The code's shape, held as tests: small signatures, and strategy knowledge in the strategy modules."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "qa_train"
MAX_PARAMETERS = 6
# The modules allowed to know about strategies (DeepSpeed, FSDP, ZeRO): the strategy module, the
# checkpoint modules (checkpoint, saving) and the launcher. metrics.json's schema and the strategy report name them as values.
STRATEGY_MODULES = {"distributed.py", "checkpoint.py", "saving.py", "launch.py"}


def functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}", node))
    return found


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return len([n for n in names if n not in ("self", "cls")])


def test_no_function_takes_more_than_six_parameters() -> None:
    too_many = [f"{where} ({parameter_count(node)})" for where, node in functions()
                if parameter_count(node) > MAX_PARAMETERS]
    assert len(functions()) > 100 and not too_many, too_many


def test_strategy_specific_code_lives_in_the_strategy_modules() -> None:
    """DeepSpeed's and FSDP's APIs are touched only where a library forces a difference."""
    markers = ("DummyOptim", "DummyScheduler", "deepspeed_plugin", "fsdp_plugin", "ds_numel", "DistributedType",
               "InitProcessGroupKwargs")
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in STRATEGY_MODULES:
            continue
        text = path.read_text()
        offenders += [f"{path.name}: {m}" for m in markers if m in text]
    assert not offenders, offenders

