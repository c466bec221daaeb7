"""A released project's own tests, from its source distribution, fetched once and cached.

The tests are those of the version installed in the running environment: the sdist is found on
the package index (PEP 691 JSON, ``$PIP_INDEX_URL`` or PyPI), checked against the index's
SHA-256, and extracted under ``$XDG_CACHE_HOME/aiosendfile/host-suites``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import urllib.request
from pathlib import Path

__all__ = ("cache_dir", "sdist_folder")

_INDEX = "https://pypi.org/simple/"
_JSON = "application/vnd.pypi.simple.v1+json"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "aiosendfile", "host-suites")


def _sdist_url(project: str, version: str) -> tuple[str, str]:
    index = os.environ.get("PIP_INDEX_URL") or _INDEX
    if not index.startswith(("https://", "http://")):
        index = _INDEX
    request = urllib.request.Request(f"{index.rstrip('/')}/{project.lower()}/", headers={"Accept": _JSON})
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = json.load(answer)["files"]
    wanted = {f"{project.lower()}-{version}.tar.gz", f"{project}-{version}.tar.gz"}
    for entry in files:
        if entry["filename"] in wanted and "sha256" in entry.get("hashes", {}):
            return entry["url"], entry["hashes"]["sha256"]
    raise LookupError(f"no source distribution of {project} {version} on {index}")


def _download(url: str, sha256: str, into: Path) -> None:
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=300) as answer, open(into, "wb") as out:
        while chunk := answer.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise ValueError(f"{url}: SHA-256 {digest.hexdigest()}, the index says {sha256}")


def sdist_folder(project: str, version: str, folder: str) -> Path:
    """*folder* of *project* *version*'s sdist, extracted whole in the cache (fetched if absent):
    the tests and, beside them, the project's own test settings (``pyproject.toml``)."""
    root = cache_dir()
    target = root / f"{project.lower()}-{version}"
    done = target / ".whole"
    if not done.exists():
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as tmp:
            archive = Path(tmp, "sdist.tar.gz")
            _download(*_sdist_url(project, version), archive)
            staging = Path(tmp, "tree")
            with tarfile.open(archive) as tar:
                top = tar.getnames()[0].split("/")[0]
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(staging, filter="data")
                else:  # (Python 3.10 before 3.10.12: no filters; the index's hash was checked)
                    tar.extractall(staging)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging / top, target)  # (a half-extracted tree is never taken for a whole one)
            done.touch()
    if not (target / folder).is_dir():
        raise LookupError(f"{project} {version}'s sdist has no {folder}/")
    return target / folder
