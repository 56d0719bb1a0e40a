"""Every file name of a run or study directory is spelled in one module: the one that owns it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from interp_toolkit.runs import layout
from interp_toolkit.studies.grid import study

ROOT = Path(__file__).resolve().parents[2]
#: name -> the one module allowed to spell it (paths relative to the repository)
OWNERS = {
    **{name: "interp_toolkit/runs/layout.py" for name in (
        layout.RECORD, layout.METRICS, layout.CHECKPOINTS, layout.RESUME_STATE,
        layout.FINAL_STATE, layout.CURVES, layout.LOCK, layout.ANALYSES)},
    **{name: "interp_toolkit/studies/grid/study.py" for name in (
        study.STUDY_RECORD, study.RUNS, study.OUTCOME, study.OUTCOMES_CSV, study.RECORDED_OUTCOMES, study.TABLE_CSV,
        study.TABLE_MD, study.CONTRASTS_CSV, study.PAPER_COMPARISON_CSV)},
}
#: Names that are also ordinary words (a JSON key, a progress-bar label, an analyses registry):
#: they count only where they name a path, as an operand of ``/`` or a module constant.
WORDS = {layout.CHECKPOINTS, layout.ANALYSES, study.RUNS}


def _spellings(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            found += [side.value for side in (node.left, node.right)
                      if isinstance(side, ast.Constant) and side.value in OWNERS]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value in WORDS:
            found.append(node.value.value)
        elif isinstance(node, ast.Constant) and node.value in OWNERS and node.value not in WORDS:
            found.append(node.value)
    return found


def test_run_and_study_file_names_are_spelled_in_their_owner_module_only():
    where: dict[str, set[str]] = defaultdict(set)
    for package in ("interp_toolkit", "analyses", "tasks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in _spellings(ast.parse(path.read_text(encoding="utf-8"))):
                where[name].add(path.relative_to(ROOT).as_posix())
    assert set(where) == set(OWNERS)  # each name is spelled somewhere: its owner
    strays = {name: sorted(paths - {OWNERS[name]}) for name, paths in where.items() if paths != {OWNERS[name]}}
    assert strays == {}, f"file names spelled outside their owner module: {strays}"


def test_layout_paths_and_metrics_reader(tmp_path):
    from interp_toolkit.runs.metrics import read_run_metrics

    run = tmp_path / "run"
    assert read_run_metrics(run) == []  # nothing logged yet
    run.mkdir()
    layout.metrics_path(run).write_text('{"epoch": 0}\n{"epoch": 10}\n{"epo')  # a line being appended
    assert read_run_metrics(run) == [{"epoch": 0}, {"epoch": 10}]
    assert layout.checkpoints_dir(run) == run / "checkpoints" and layout.curves_path(run).name == "curves.png"
    assert layout.checkpoint_path(run, 20) == run / "checkpoints" / "epoch_000020.safetensors"
