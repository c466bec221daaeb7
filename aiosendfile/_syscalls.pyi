# aiosendfile/_syscalls.c, built at install where Linux and a C compiler are (hatch_build.py).
from os import PathLike

ABI: int

def cachestat(fd: int, offset: int, size: int, /) -> int: ...
def openat2_cached(
    path: str | bytes | PathLike[str] | PathLike[bytes], flags: int, resolve: int, /
) -> int: ...
