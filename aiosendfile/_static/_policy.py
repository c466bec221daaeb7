"""What a served directory allows: the policy every static decision reads (immutable, per mount)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from ._archive import DEFAULT_MAX_ENTRIES
from ._mime import read_type_tables

__all__ = ("DEFAULT_INLINE_LIMIT", "ENCODINGS", "DirectoryPolicy", "file_policy")

#: Bodies up to this size are answered from memory (the hot cache) and leave with the headers.
DEFAULT_INLINE_LIMIT = 64 * 1024

#: Pre-compressed siblings, in the server's order of preference.
ENCODINGS = (("br", ".br"), ("gzip", ".gz"))


@dataclass(frozen=True, slots=True)
class DirectoryPolicy:
    """How a directory (or one file) is served.

    ``root`` is the ``os.path.realpath`` of the served directory, every file opened must lie
    inside it (unless ``follow_symlinks``); None serves a lone file (``FileResponse(path)``), where
    a symlinked pre-compressed sibling counts as absent. ``dotfiles`` serves names starting with
    ``.`` (``/.well-known/`` is always served); ``listings`` shows a directory without an index;
    ``precompressed`` serves ``.br``/``.gz`` siblings and sends ``Vary: Accept-Encoding``;
    ``upload_form`` puts a form on listing pages that posts files to the directory (``serve
    --upload``: the door receives them; with ``resumable_uploads`` its script sends each file as a
    resumable upload, resumed after a dropped connection); ``archives`` answers ``?tar``
    (``?zip``) on a listed directory with the folder as a tar (stored zip) archive (``_archive``,
    ``_zip``), of at most ``max_archive_entries`` entries and ``max_archive_size`` bytes of files
    (413 beyond), and links it from the listing; ``relative_locations`` makes a folder's redirect
    to its slash relative (``./sub/``: right behind a proxy that strips a prefix, as ``serve``'s
    other addresses; the doors' are absolute paths under their mount, as Starlette's).
    """

    root: str | None
    index: str | None = "index.html"
    listings: bool = False
    dotfiles: bool = False
    follow_symlinks: bool = False
    precompressed: bool = True
    hot_cache: bool = True
    inline_limit: int = DEFAULT_INLINE_LIMIT
    max_ranges: int = 16
    upload_form: bool = False
    resumable_uploads: bool = False
    archives: bool = False
    max_archive_entries: int = DEFAULT_MAX_ENTRIES
    max_archive_size: int | None = None
    relative_locations: bool = False
    #: The root hot entries are checked under (None when symlinks may point anywhere).
    cache_root: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_root", None if self.follow_symlinks else self.root)
        read_type_tables()  # (a door is made at its start: the first answer does not read them)


@functools.lru_cache(maxsize=64)
def file_policy(
    root: str | None, follow_symlinks: bool, precompressed: bool, hot_cache: bool, inline_limit: int
) -> DirectoryPolicy:
    """The policy one file response answers under (the doors' ``FileResponse``): one per
    combination of its options, the last 64 kept. *root*: a real path every file opened must
    lie under (a static resource's), or None. A served directory's policy is
    ``_fs.directory_policy``'s."""
    return DirectoryPolicy(
        root,
        follow_symlinks=follow_symlinks,
        precompressed=precompressed,
        hot_cache=hot_cache,
        inline_limit=inline_limit,
    )
