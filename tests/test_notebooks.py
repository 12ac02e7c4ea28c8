"""Execute every notebook in notebooks/ in a fresh kernel: each must run top to bottom cleanly.

What a notebook shows is checked in the notebook itself: every equivalence it prints ("same
predictions", "decode recovers the episode", ...) is also an ``assert`` in its cell, and so is
each result it reports (an accuracy, a loss that falls) against a floor that holds, with margin,
in the quick mode this test runs — a failed assert fails the test like any other error.

Notebooks read ``UNITOK_NOTEBOOK_QUICK=1`` to shrink their data and training so this stays fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env["UNITOK_NOTEBOOK_QUICK"] = "1"
    env["MPLBACKEND"] = "Agg"
    # Find the kernelspec installed with this interpreter's ipykernel first, so the kernel runs
    # the same Python (and the same installed unitok) as the tests. Its argv is "python", which
    # jupyter_client replaces with sys.executable.
    jupyter_data = str(Path(sys.prefix) / "share" / "jupyter")
    env["JUPYTER_PATH"] = os.pathsep.join(p for p in (jupyter_data, env.get("JUPYTER_PATH")) if p)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _kernel_env()
    # The kernelspec lookup happens in this process, so it needs JUPYTER_PATH too.
    monkeypatch.setenv("JUPYTER_PATH", env["JUPYTER_PATH"])
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},  # the kernel's working directory
    )
    try:
        client.execute(env=env)
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"{path.name} failed:\n{err}", pytrace=False)

    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code_cells, f"{path.name} has no code cells"
    for index, cell in enumerate(code_cells):
        assert cell.get("execution_count") is not None, (
            f"{path.name}: code cell {index} did not run"
        )
        errors = [out for out in cell.get("outputs", []) if out.get("output_type") == "error"]
        assert not errors, (
            f"{path.name}: code cell {index} raised "
            f"{errors[0].get('ename')}: {errors[0].get('evalue')}\n{cell.source}"
        )


def test_notebooks_are_stored_without_outputs() -> None:
    """Notebooks are committed clean: no outputs or execution counts in the repository."""
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for index, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
            assert not cell.get("outputs") and cell.get("execution_count") is None, (
                f"{path.name}: code cell {index} has stored outputs; clear them before committing"
            )
