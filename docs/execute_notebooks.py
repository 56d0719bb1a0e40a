"""Execute the example notebooks in place, so that they ship with their outputs.

Usage: ``python docs/execute_notebooks.py [NOTEBOOK ...]`` (default: every
``examples/*.ipynb``). Each notebook runs top to bottom in a fresh kernel inside a temporary
directory (``RUN_DIR`` / ``OUT_DIR`` point there, so nothing is written into the
repository) and is written back with its outputs. Figures are embedded as PNG at the
toolkit's screen resolution (``interp_toolkit.plotting.STYLE["figure.dpi"]``), recompressed
losslessly, which keeps each notebook to a few hundred kilobytes. Temporary paths
and the executing machine's Jupyter warnings are scrubbed from the outputs.
``tests/test_notebooks.py`` checks that the committed outputs match a fresh execution (slow test) and stay small.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: Text that differs between machines or executions; replaced before writing.
_VOLATILE = [
    (re.compile(r"/tmp/ipykernel_\d+/\d+\.py"), "<cell>"),
    (re.compile(r"/(tmp|work|home|root|Users)/[^\s'\"]*"), "<path>"),
    (re.compile(r"0x[0-9a-f]{6,}"), "0x..."),
]
#: Stream output about the executing machine's Jupyter install, not about the notebook.
_ENVIRONMENT_NOISE = ("TqdmWarning: IProgress not found",)


def scrub(text: str) -> str:
    """``text`` with temporary paths and object addresses replaced by placeholders."""
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def small_png(data: str) -> str:
    """A base64 PNG re-encoded losslessly at the highest compression (matplotlib writes
    PNGs fast rather than small); a palette would band colour maps, so none is used."""
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.open(io.BytesIO(base64.b64decode(data))).save(buffer, "PNG", optimize=True)
    smaller = base64.b64encode(buffer.getvalue()).decode()
    return smaller if len(smaller) < len(data) else data


def _scrub_outputs(notebook: Any) -> None:
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        cell.outputs = [o for o in cell.outputs if not (
            o.output_type == "stream" and any(noise in o.text for noise in _ENVIRONMENT_NOISE))]
        for output in cell.outputs:
            if "text" in output:
                output["text"] = scrub(output["text"])
            data = output.get("data", {})
            if "text/plain" in data:
                data["text/plain"] = scrub(data["text/plain"])
            # a figure's repr duplicates its PNG as text ("<Figure size ...>")
            if "image/png" in data:
                data.pop("text/plain", None)
                data["image/png"] = small_png(data["image/png"])
            output.get("metadata", {}).pop("execution", None)
        cell.metadata.pop("execution", None)


def execute(path: Path, workdir: Path, timeout: int = 900) -> Any:
    """Run the notebook at ``path`` in a fresh kernel inside ``workdir``; return it executed.

    Args:
        path: The ``.ipynb`` file (not modified).
        workdir: Working directory of the kernel; ``RUN_DIR`` and ``OUT_DIR`` point inside it.
        timeout: Seconds one cell may run.

    Returns:
        The executed ``nbformat`` notebook, volatile text scrubbed (see :func:`scrub`).
    """
    import nbclient
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    env = dict(os.environ)
    env.update(RUN_DIR=str(workdir / "run"), OUT_DIR=str(workdir / "out"),
               MPLBACKEND="module://matplotlib_inline.backend_inline", TQDM_DISABLE="1")
    client = nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute(env=env)
    _scrub_outputs(notebook)
    return notebook


def main(argv: list[str]) -> int:
    import nbformat

    paths = [Path(a) for a in argv] or sorted((ROOT / "examples").glob("*.ipynb"))
    for path in paths:
        with tempfile.TemporaryDirectory() as workdir:
            notebook = execute(path, Path(workdir))
        nbformat.write(notebook, path)
        print(f"{path}: {path.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
