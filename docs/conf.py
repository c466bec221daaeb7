"""Sphinx configuration of the aiosendfile site: ``python -m nox -s docs`` builds it into docs/_build/html.

Why Sphinx (with the furo theme, autodoc, and myst-parser for the Markdown pages) and not MkDocs with
mkdocstrings: the package's docstrings are reStructuredText (``literals``, :func:/:class: roles), which
autodoc renders as they are; the pages stay Markdown, readable on GitHub too; and ``-W`` turns every
warning (a broken cross-reference, a bad docstring, a missing page) into a failed build.

The build is offline: no intersphinx, no remote images, fonts or scripts (furo ships its assets), so it
needs nothing beyond the pip install of the ``docs`` extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes

import aiosendfile

project = "aiosendfile"
author = "aiosendfile developers"
copyright = "2026, aiosendfile developers"
version = release = aiosendfile.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Markdown: heading anchors as GitHub makes them, so `page.md#a-heading` links work on both.
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"

html_theme = "furo"
html_title = f"aiosendfile {release}"
html_show_sourcelink = False
html_copy_source = False


def _write_cli_help() -> None:
    """``aiosendfile [COMMAND] --help`` into _build/cli/, for the pages to include: help that cannot drift."""
    out = Path(__file__).parent / "_build" / "cli"
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COLUMNS": "96", "NO_COLOR": "1", "PYTHON_COLORS": "0"}
    for command in ([], ["serve"], ["send"], ["recv"]):
        text = subprocess.run(
            [sys.executable, "-m", "aiosendfile", *command, "--help"],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
        (out / "-".join(["aiosendfile", *command, "help.txt"])).write_text(text)


_write_cli_help()


def _outside_files_as_downloads(app: Any, doctree: nodes.document) -> None:
    """A link from a page to a file outside docs/ (``../benchmarks/README.md``): on the site, that file.

    Such links work on GitHub as they are; MyST, seeing ``.md``, looks for a page of that name and
    warns. Here they become downloads of the file itself (Sphinx copies it into the site).
    """
    srcdir = Path(app.srcdir).resolve()
    here = (srcdir / app.env.docname).parent
    for ref in list(doctree.findall(addnodes.pending_xref)):
        target = ref.get("reftarget", "")
        if ref.get("refdomain") != "doc" or target in app.env.found_docs:
            continue
        path = (srcdir / f"{target}.md").resolve()  # MyST gives the file's name, relative or absolute
        if srcdir in path.parents or not path.is_file():
            continue
        download = addnodes.download_reference(
            "",
            "",
            *ref.children,
            refdoc=ref["refdoc"],
            reftarget=os.path.relpath(path, here),
            refexplicit=True,
        )
        ref.replace_self(download)


def setup(app: Any) -> None:
    # Before Sphinx's own doctree-read handlers (priority 500), which collect the downloads.
    app.connect("doctree-read", _outside_files_as_downloads, priority=400)
