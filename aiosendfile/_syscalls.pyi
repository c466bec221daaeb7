# aiosendfile/_syscalls.c, built at install where Linux and a C compiler are (hatch_build.py).
from os import PathLike

ABI: int

def cachestat(fd: int, offset: int, size: int, /) -> int: ...
def openat2_cached(
    path: str | bytes | PathLike[str] | PathLike[bytes], flags: int, resolve: int, /
) -> int: ...
def accept(fd: int, /) -> int: ...
def stat_identity(
    path: str | bytes | PathLike[str] | PathLike[bytes], /
) -> tuple[int, int, int, int, int] | int: ...
def reopen_read(
    path: str | bytes | PathLike[str] | PathLike[bytes],
    ident: object,
    head: bytes,
    read_max: int,
    probe_max: int,
    /,
) -> bytes | tuple[int, int, int] | None: ...
