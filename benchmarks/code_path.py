"""One GET followed through ``serve``'s code: how many modules it passes through, and how often.

``python -m benchmarks.code_path [TREE]`` starts ``serve``'s engine in this process (from the
checkout *TREE*, default this one), asks for a 4 KiB file twice (a first sight, then the answer
cache's), and records every call and return in the package from ``HttpProtocol.data_received``
on (``sys.setprofile``). A *stay* is a run of events in one module; a *return to another module*
is a return whose next event is in another module. Not a timing: a reading aid (how far a
newcomer follows one request).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from types import FrameType
from typing import Any

Event = tuple[str, str, str]  # (call or return, module path in the package, function)


def _recorder(package: str) -> tuple[list[Event], Any]:
    events: list[Event] = []

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event in ("call", "return"):
            name = frame.f_code.co_filename
            if name.startswith(package):
                events.append((event, name[len(package) :], frame.f_code.co_name))

    return events, profile


def summary(events: list[Event]) -> tuple[list[str], int]:
    """The stays (module per run) and the returns to another module, from ``data_received`` on."""
    start = next(i for i, e in enumerate(events) if e[2] == "data_received" and "_serve" in e[1])
    events = events[start:]
    stays: list[str] = []
    for _, module, _ in events:
        if not stays or stays[-1] != module:
            stays.append(module)
    returns = sum(1 for i, e in enumerate(events[:-1]) if e[0] == "return" and events[i + 1][1] != e[1])
    return stays, returns


async def follow() -> None:
    import aiosendfile
    from aiosendfile._serve._server import ServeConfig, shutdown, start_server

    package = os.path.dirname(aiosendfile.__file__) + os.sep
    with tempfile.TemporaryDirectory() as root:
        for name in ("warm.txt", "file.txt"):
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"x" * 4096)
        server = await start_server(ServeConfig(directory=root), host="127.0.0.1", port=0)
        port = server._sock.getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def get(path: str, trace: bool) -> list[Event]:
            writer.write(f"GET /{path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            events, profile = _recorder(package)
            if trace:
                sys.setprofile(profile)
            head = await reader.readuntil(b"\r\n\r\n")
            sys.setprofile(None)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            return events

        for _ in range(2):
            await get("warm.txt", False)  # (the interpreter's first paths, elsewhere)
        for label in ("a first sight", "the answer cache"):
            stays, returns = summary(await get("file.txt", True))
            modules = len(set(stays))
            print(f"{label}: {len(stays)} stays, {modules} modules, {returns} returns to another module")
            print("   ", " > ".join(stay.removesuffix(".py") for stay in stays))
        writer.close()
        await shutdown(server)


def main() -> None:
    if len(sys.argv) > 1:
        sys.path.insert(0, os.path.abspath(sys.argv[1]))
    asyncio.run(follow())


if __name__ == "__main__":
    main()
