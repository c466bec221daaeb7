"""Archives read back for the tests of ``serve``'s folder archives: each member's bytes by name
(folders as None), names as ``tarfile`` gives them (a name that is not UTF-8 keeps its bytes as
surrogate escapes)."""

from __future__ import annotations

import io
import tarfile
import zipfile


def tar_members(data: bytes) -> dict[str, bytes | None]:
    """A tar's members, read by ``tarfile``."""
    out: dict[str, bytes | None] = {}
    with tarfile.open(fileobj=io.BytesIO(data), encoding="utf-8", errors="surrogateescape") as tf:
        for info in tf:
            extracted = tf.extractfile(info) if info.isfile() else None
            out[info.name] = extracted.read() if extracted is not None else None
    return out


def zip_members(data: bytes) -> dict[str, bytes | None]:
    """A zip's members, read and CRC-checked by ``zipfile`` (a name without the UTF-8 flag is
    the file system's bytes, which ``zipfile`` reads as cp437)."""
    out: dict[str, bytes | None] = {}
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        for info in zf.infolist():
            name = info.filename
            if info.flag_bits & 0x800 == 0 and not name.isascii():
                name = name.encode("cp437").decode("utf-8", "surrogateescape")
            out[name.rstrip("/")] = None if info.is_dir() else zf.read(info)
    return out
