"""What lakelog writes where it runs by default (``serve``'s data directory, ``cluster
up``'s directory) is git-ignored, so a user trying lakelog in a clone commits none of it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ingest_api.settings import ApiSettings
from lakelog.cli.cluster import DEFAULT_DIR

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                    reason="needs git and a clone")
def test_default_directories_are_git_ignored() -> None:
    defaults = [Path(str(ApiSettings.model_fields["data_dir"].default)), DEFAULT_DIR]
    for directory in defaults:
        inside = f"{directory}/broker-1/hot/orders-0/00000000000000000000.log"
        found = subprocess.run(["git", "check-ignore", "--no-index", "-q", inside], cwd=ROOT)
        assert found.returncode == 0, f"{directory}/ is not in .gitignore"
