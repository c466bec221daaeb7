"""The wheel's optional compiled part: ``aiosendfile/_syscalls.c``, built where Linux and a C compiler are.

Without it (no compiler, not Linux, ``AIOSENDFILE_NO_EXTENSIONS=1``, a failed compile) the wheel is
pure Python and ``aiosendfile._platform`` does without ``cachestat``/``openat2``, as on a kernel that
lacks them: the build never fails for its sake. An editable install compiles it into the checkout
(beside the source, one file per Python: ``_syscalls.cpython-311-x86_64-linux-gnu.so``, ignored by
git), replacing that Python's earlier one at once, or removing it where it builds nothing, so such
an install runs pure; a wheel gets it from a build directory and is tagged for its Python and platform.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = os.path.join("aiosendfile", "_syscalls.c")


def _compile(source: str, target: str) -> str | None:
    """Compile *source* into the extension module *target*; None, or why it was not built (then
    nothing is left at *target*, nor half a file beside it)."""
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python.h in {include}"
    partial = f"{target}.{os.getpid()}.tmp"
    try:
        cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
        cflags = ["-O2", "-fPIC", "-Wall", "-std=c99", "-D_GNU_SOURCE", "-pthread", f"-I{include}"]
        command = [*cc, *cflags, "-shared", source, "-o", partial]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            return f"{shlex.join(command)} failed:\n{done.stderr.strip()}"
        os.replace(partial, target)  # at once: a process importing the old file never sees half of it
        return None
    except (OSError, ValueError, subprocess.SubprocessError) as exc:  # (ValueError: CC unparsable)
        return f"{exc}"
    finally:
        with contextlib.suppress(OSError):
            os.remove(partial)


def _remove(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            os.remove(path)


class SyscallsBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self._made: str | None = None
        if not sys.platform.startswith("linux"):
            return  # cachestat and openat2 are Linux's
        name = "_syscalls" + sysconfig.get_config_var("EXT_SUFFIX")
        # An editable install builds into the checkout: a new build replaces this Python's earlier
        # one at once (another install of the same checkout may be running tests on it), and an
        # install that builds nothing (no compiler, a compile error, the variable below) removes
        # it, so that the last one is not left in use.
        earlier = os.path.join(self.root, "aiosendfile", name) if version == "editable" else None
        if os.environ.get("AIOSENDFILE_NO_EXTENSIONS"):
            _remove(earlier)
            self.app.display_info("aiosendfile: AIOSENDFILE_NO_EXTENSIONS set, the wheel is pure Python")
            return
        if earlier is not None:
            target = earlier
        else:
            self._made = tempfile.mkdtemp(prefix="aiosendfile-build-")
            target = os.path.join(self._made, name)
        why = _compile(os.path.join(self.root, SOURCE), target)
        if why is not None:
            _remove(earlier)
            self.app.display_warning(f"aiosendfile: {name} not built, pure Python instead ({why})")
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":
            build_data["force_include"][target] = f"aiosendfile/{name}"

    def clean(self, versions: list[str]) -> None:
        """``hatch clean``: the builds an editable install left in the checkout, every Python's."""
        for built in glob.glob(os.path.join(self.root, "aiosendfile", "_syscalls.*.so")):
            with contextlib.suppress(OSError):
                os.remove(built)

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if getattr(self, "_made", None):
            shutil.rmtree(self._made, ignore_errors=True)
