"""The example notebooks ship executed, with small outputs that a fresh execution reproduces.

Regenerate them with ``python docs/execute_notebooks.py`` (about a minute each on a laptop CPU).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
#: Upper bound on a committed notebook (figures as PNG at screen resolution).
MAX_BYTES = 600 * 1024
REGENERATE = "regenerate with: python docs/execute_notebooks.py"


def _executor():
    spec = importlib.util.spec_from_file_location("execute_notebooks", ROOT / "docs" / "execute_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _code_cells(notebook: dict) -> list[dict]:
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def _shape(cell: dict) -> list[tuple]:
    """What a cell shows, without the values: output kinds, streams and MIME types."""
    return [(o["output_type"], o.get("name"), tuple(sorted(o.get("data", {})))) for o in cell["outputs"]]


def test_there_are_notebooks():
    names = {path.name for path in NOTEBOOKS}
    assert {"circuit_study.ipynb", "bif_hierarchy.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_executed_with_small_outputs(path):
    notebook = json.loads(path.read_text())
    cells = _code_cells(notebook)
    # executed top to bottom in one kernel: execution counts 1, 2, 3, ...
    assert [cell["execution_count"] for cell in cells] == list(range(1, len(cells) + 1)), REGENERATE
    outputs = [o for cell in cells for o in cell["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"], REGENERATE
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 2, f"{path.name}: expected its figures inline, got {len(images)} images"
    assert path.stat().st_size < MAX_BYTES, f"{path.name}: {path.stat().st_size} bytes"
    text = json.dumps(outputs)
    # nothing about the machine that executed it
    assert not re.search(r"/(tmp|work|home|root|Users)/", text), REGENERATE
    assert "TqdmWarning" not in text


def test_scrub_replaces_machine_paths():
    executor = _executor()
    assert executor.scrub("/tmp/ipykernel_12/3456.py:2: UserWarning: x") == "<cell>:2: UserWarning: x"
    assert executor.scrub("run at /work/a/b/run.json") == "run at <path>"


@pytest.mark.slow  # each notebook runs about a minute on the shared 2-core machine
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_outputs_match_a_fresh_execution(path, tmp_path):
    """A fresh execution shows the same outputs cell by cell (kinds, streams, figures and
    tables; numbers may differ in the last digits across machines), so committed outputs
    cannot go stale when the code or the notebook changes."""
    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    fresh = _executor().execute(path, tmp_path)
    committed = json.loads(path.read_text())
    fresh_cells, committed_cells = _code_cells(json.loads(json.dumps(fresh))), _code_cells(committed)
    assert ["".join(c["source"]) for c in fresh_cells] == ["".join(c["source"]) for c in committed_cells]
    assert not [o for c in fresh_cells for o in c["outputs"] if o["output_type"] == "error"]
    for number, (new, old) in enumerate(zip(fresh_cells, committed_cells, strict=True), 1):
        assert _shape(new) == _shape(old), f"{path.name} code cell {number}: outputs differ; {REGENERATE}"
        new_text = [o.get("data", {}).get("text/plain") or o.get("text") for o in new["outputs"]]
        old_text = [o.get("data", {}).get("text/plain") or o.get("text") for o in old["outputs"]]
        # same lines with the same words; numbers are compared by their count only
        words = [re.sub(r"-?\d[\d.e+-]*", "#", "".join(t or "")) for t in new_text]
        assert words == [re.sub(r"-?\d[\d.e+-]*", "#", "".join(t or "")) for t in old_text], (
            f"{path.name} code cell {number}: text differs; {REGENERATE}")
