"""The benchmarks' "before" contenders run the tree before, not this one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness.servers import repo_env
from benchmarks.http_contenders import BEFORE_ENV, _from_before


def test_a_before_contender_imports_the_checkout_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve-before`` (``python -m aiosendfile``) run where ``_from_before`` says imports the
    package of ``AIOSENDFILE_BEFORE``'s checkout: run from this repository (as it was), the
    working directory came first and every "before" row was this tree's own."""
    before = tmp_path / "before"
    (before / "aiosendfile").mkdir(parents=True)
    (before / "aiosendfile" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(BEFORE_ENV, "before")  # (relative: made absolute, the server runs elsewhere)
    env = repo_env()
    where = _from_before("serve-before", env)
    assert where == str(before)
    code = "import aiosendfile; print(aiosendfile.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=where, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == str(before / "aiosendfile" / "__init__.py")
