"""The documentation site builds from docs/ with warnings as errors: a broken link, a
missing anchor or a page left out of the navigation fails the suite."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site), "--config-file", str(root / "mkdocs.yml")],
                          capture_output=True, text=True, timeout=300)


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    out = build(ROOT, tmp_path / "site")
    assert out.returncode == 0, out.stderr[-4000:]
    assert (tmp_path / "site" / "http-api" / "index.html").exists()


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", copy / "docs")
    page = copy / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [nowhere](cli.md#no-such-section).\n")
    out = build(copy, tmp_path / "site")
    assert out.returncode != 0 and "no-such-section" in out.stderr, out.stderr[-2000:]


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs (Python-Markdown's toc) and GitHub make it."""
    text = re.sub(r"[`*_]", "", heading)
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readme_links_only_to_pages_and_sections_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    broken = []
    for page, anchor in re.findall(r"\]\((docs/[^)#]+)(?:#([^)]+))?\)", text):
        if not (ROOT / page).exists():
            broken.append(page)
        elif anchor and anchor not in {slug(h) for h in re.findall(
                r"^#+ (.*)$", (ROOT / page).read_text(), re.M)}:
            broken.append(f"{page}#{anchor}")
    assert not broken, broken
    assert len(text.splitlines()) < 400, "the README is for a user's first hour"


def test_anchors_are_made_as_mkdocs_and_github_make_them() -> None:
    assert slug("Delta freshness: `delta.target.lag.ms`") == "delta-freshness-deltatargetlagms"
