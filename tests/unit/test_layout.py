"""The code's shape, held as tests: packages by concern that import only downward, no cycle, small signatures,
and strategy knowledge in strategy/ alone."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "qa_train"
MAX_PARAMETERS = 6
# The entry points and the run's phases, read top to bottom; everything else lives in a package by concern.
TOP_MODULES = {"__init__", "__main__", "cli", "run", "trainer", "evaluation", "outcome", "predict"}
TOP = "(top)"
# What each package may import, besides itself: the floors, lowest first. `studies` (benchmarks, reports, the
# planner) sits beside the training path and nothing on that path imports it; only the command line sees all.
FLOORS = ["core", "config", "data", "observe", "strategy", "squad", "model", TOP, "studies", "cli"]
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "config": {"core"},
    "data": {"core", "config"},
    "observe": {"core", "config"},
    "strategy": {"core", "config", "observe"},
    "squad": {"core", "config", "data"},
    "model": {"core", "config", "data", "strategy"},
    TOP: {"core", "config", "data", "observe", "strategy", "squad", "model"},
    "studies": {"core", "config", "data", "observe", "strategy", "squad", "model"},
    "cli": set(FLOORS) - {"cli"},
}
# DeepSpeed's and FSDP's APIs: touched only in strategy/, where a library forces a difference.
STRATEGY_MARKERS = (
    "DummyOptim",
    "DummyScheduler",
    "deepspeed_plugin",
    "fsdp_plugin",
    "ds_numel",
    "DistributedType",
    "InitProcessGroupKwargs",
    "fully_shard",
)
STRATEGY_LIBRARIES = ("deepspeed", "torch.distributed.fsdp")


def modules() -> dict[str, Path]:
    """Every module by its dotted name under qa_train (`strategy.checkpoint`, `trainer`)."""
    return {".".join(p.relative_to(PACKAGE).with_suffix("").parts): p for p in sorted(PACKAGE.rglob("*.py"))}


def package_of(module: str) -> str:
    head = module.split(".")[0]
    if head == "cli":
        return "cli"
    return TOP if head in TOP_MODULES or head.startswith("__") else head


def imports(path: Path, known: set[str]) -> set[str]:
    """The qa_train modules a file imports, lazily inside functions too (`from qa_train.x import y` names module
    x.y where that is a module, else x)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "qa_train":
            base = node.module.removeprefix("qa_train").lstrip(".")
            names = [
                f"{base}.{a.name}".lstrip(".") if f"{base}.{a.name}".lstrip(".") in known else base for a in node.names
            ]
        elif isinstance(node, ast.Import):
            names = [a.name.removeprefix("qa_train.") for a in node.names if a.name.startswith("qa_train.")]
        found |= {n for n in names if n}
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: {m for m in imports(path, known) if m in known and m != name} for name, path in mods.items()}


def test_modules_live_in_packages_by_concern() -> None:
    loose = {name for name in modules() if "." not in name} - TOP_MODULES
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert not loose, f"modules outside a package: {sorted(loose)}"
    assert packages == set(FLOORS) - {TOP, "cli"}, packages


def test_every_import_runs_down_the_floors() -> None:
    upward = [
        f"{a} -> {b}"
        for a, targets in graph().items()
        for b in sorted(targets)
        if package_of(a) != package_of(b) and package_of(b) not in ALLOWED[package_of(a)]
    ]
    assert not upward, upward


def test_nothing_on_the_training_path_imports_the_studies() -> None:
    training = [m for m in modules() if package_of(m) not in ("studies", "cli")]
    g = graph()
    assert not [f"{m} -> {t}" for m in training for t in g[m] if package_of(t) == "studies"]


def test_no_module_imports_itself_round_a_cycle() -> None:
    g, state, cycles = graph(), {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(g[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for name in sorted(g):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def test_the_floors_allow_no_cycle_between_packages() -> None:
    for i, floor in enumerate(FLOORS):
        assert ALLOWED[floor] <= set(FLOORS[:i]), f"{floor} may import a floor above it"


def test_the_layout_rules_catch_an_upward_import(tmp_path: Path) -> None:
    """The graph reader sees lazy imports and `from package import module`: a rule that reads nothing passes all."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from qa_train.studies import report\n    from qa_train.trainer import Trainer\n")
    known = set(modules())
    assert imports(probe, known) == {"studies.report", "trainer"}


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
    found = functions()
    too_many = [f"{where} ({parameter_count(node)})" for where, node in found if parameter_count(node) > MAX_PARAMETERS]
    assert len(found) > 100 and not too_many, too_many


def test_strategy_specific_code_lives_in_strategy() -> None:
    """DeepSpeed's and FSDP's APIs are touched only where a library forces a difference."""
    offenders = []
    for name, path in modules().items():
        if package_of(name) == "strategy":
            continue
        text = path.read_text()
        offenders += [f"{name}: {m}" for m in STRATEGY_MARKERS if m in text]
        for node in ast.walk(ast.parse(text)):
            imported = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            offenders += [
                f"{name}: imports {m}"
                for m in imported
                if any(m == lib or m.startswith(f"{lib}.") for lib in STRATEGY_LIBRARIES)
            ]
    assert not offenders, offenders


def settings_tuples(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Parameters annotated as a tuple of different types (`tuple[bool, float, IO | None]`): settings bundled
    anonymously, which the six-parameter rule would not see."""
    a = node.args
    found = []
    for p in (*a.posonlyargs, *a.args, *a.kwonlyargs):
        ann = p.annotation
        if isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("tuple", "Tuple"):
            parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            kinds = {ast.unparse(e) for e in parts if ast.unparse(e) != "..."}
            if len(kinds) > 1:
                found.append(f"{p.arg}: {ast.unparse(ann)}")
    return found


def test_no_parameter_is_an_anonymous_tuple_of_settings() -> None:
    bundled = [f"{where} ({', '.join(found)})" for where, node in functions() if (found := settings_tuples(node))]
    assert not bundled, bundled


def test_the_tuple_rule_sees_a_bundle_and_passes_data(tmp_path: Path) -> None:
    fn = ast.parse("def f(a, s: tuple[bool, float, IO[str] | None], x: tuple[int, int], y: tuple[str, ...]): ...")
    assert settings_tuples(fn.body[0]) == ["s: tuple[bool, float, IO[str] | None]"]
