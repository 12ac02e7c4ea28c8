"""CI fails on a skipped test (CI=true) — a skip mark, a module-level importorskip, an xfail that
fails or passes — and says which and why; outside CI a skip is reported, not fatal."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")


def run_pytest(folder: Path, ci: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(folder)],
                          capture_output=True, text=True, env=env, cwd=folder, timeout=120)


def project(folder: Path, tests: str, name: str = "test_some.py") -> Path:
    """``folder`` as a test project: the suite's conftest and one test file holding ``tests``."""
    shutil.copy(CONFTEST, folder / "conftest.py")
    (folder / name).write_text(tests)
    return folder


def test_a_skipped_test_fails_the_run_under_ci_only(tmp_path):
    project(tmp_path,
        "import pytest\n\n"
        "def test_runs():\n    assert 1 + 1 == 2\n\n"
        "@pytest.mark.skip(reason='optional thing missing')\n"
        "def test_skipped():\n    pass\n")
    under_ci = run_pytest(tmp_path, "true")
    assert under_ci.returncode == 1, under_ci.stdout
    assert "1 test(s) skipped" in under_ci.stdout and "optional thing missing" in under_ci.stdout
    locally = run_pytest(tmp_path, None)
    assert locally.returncode == 0 and "optional thing missing" in locally.stdout
    (tmp_path / "test_some.py").write_text("def test_runs():\n    assert True\n")
    assert run_pytest(tmp_path, "true").returncode == 0  # nothing skipped: green


def test_an_xfail_fails_the_run_under_ci_whether_it_fails_or_passes(tmp_path):
    project(tmp_path,
        "import pytest\n\n"
        "def test_runs():\n    assert 1 + 1 == 2\n\n"
        "def test_xfailed():\n    pytest.xfail('optional thing missing')\n\n"
        "@pytest.mark.xfail(reason='flaky once')\n"
        "def test_xpassed():\n    assert True\n")
    under_ci = run_pytest(tmp_path, "true")
    assert under_ci.returncode == 1, under_ci.stdout
    assert "1 test(s) xfailed, 1 test(s) xpassed" in under_ci.stdout
    assert "xfailed test_some.py::test_xfailed: optional thing missing" in under_ci.stdout
    assert "xpassed test_some.py::test_xpassed: flaky once" in under_ci.stdout
    assert run_pytest(tmp_path, None).returncode == 0


def test_a_module_skipped_by_importorskip_fails_the_run_under_ci(tmp_path):
    project(tmp_path,
        "import pytest\n\n"
        "pytest.importorskip('no_such_module_xyz')\n\n"
        "def test_uses_it():\n    assert True\n", name="test_needs.py")
    under_ci = run_pytest(tmp_path, "true")  # nothing else collected: pytest's own status would be 5
    assert under_ci.returncode == 1, under_ci.stdout
    assert "1 test(s) skipped" in under_ci.stdout
    assert "skipped test_needs.py: could not import 'no_such_module_xyz'" in under_ci.stdout
