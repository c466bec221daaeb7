"""Path rules, pure: the file a request names (decoded once, checked lexically) and containment.

* NUL bytes, backslashes, absolute paths and any ``..`` segment → refused (404). The check runs
  after percent-decoding exactly once, so ``%2e%2e``, ``%2f`` and ``%00`` are caught too; double
  encoding decodes to a literal ``%`` name and stays inside.
* Dotfiles are refused unless allowed: any component starting with ``.`` (``/.env``,
  ``/a/.ssh/id_rsa``), except a leading ``.well-known`` (RFC 8615) and ``.`` segments. As nginx's
  usual ``location ~ /\\. { deny all; }`` this looks at the request path only.
* Names starting ``.upload-`` (``RESERVED``) are ``serve --upload``'s uploads in progress and its
  records of them: never looked up, even with dotfiles allowed.
* A name that is not valid UTF-8 is decoded from the raw bytes with ``os.fsdecode``, as the file
  system names it.
"""

from __future__ import annotations

import os
import re
import sys
from urllib.parse import unquote_to_bytes

__all__ = ("RESERVED", "checked", "decode", "inside")

_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
#: A component that starts with "." and is not "." alone. (Searched in C: a peer's target of
#: thousands of "/." segments must not cost a loop in Python over each.)
_DOT_NAME = re.compile(r"/\.[^/]")  # (searched in "/" + the name: no alternation, faster)
_WELL_KNOWN = ".well-known/"
#: What names of files no request reaches start with (see the module).
RESERVED = ".upload-"


def inside(path: str, root: str) -> bool:
    """Whether *path* is *root* or lies under it (both real paths)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def decode(raw: bytes) -> str:
    """A percent-encoded path decoded once, as the file system names files (surrogateescape)."""
    if b"%" not in raw:  # (no escape: the bytes are the name; fsdecode of them, faster)
        return raw.decode(_FS_ENCODING, _FS_ERRORS)
    return os.fsdecode(unquote_to_bytes(raw))


def checked(filename: str, dotfiles: bool) -> bool:
    """Whether *filename* (relative to the root, decoded) may be looked up at all."""
    if "\x00" in filename or "\\" in filename or filename.startswith("/"):
        return False
    if ".." in filename and ".." in filename.split("/"):
        return False
    if dotfiles and "/.upload-" in "/" + filename.lower():  # (RESERVED: on any file system's case)
        return False
    if not dotfiles and (filename.startswith(".") or "/." in filename):
        if filename.startswith(_WELL_KNOWN) or filename == ".well-known":
            filename = filename[len(".well-known") :]
        if _DOT_NAME.search("/" + filename):
            return False
    return True
