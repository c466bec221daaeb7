"""Upload benchmark: one large file sent by ``curl`` to each file server that takes uploads, interleaved.

Contenders, each writing into the same target directory:

* ``serve-put``: ``python -m aiosendfile serve DIR --upload --overwrite``; ``curl -T FILE URL/NAME``
  (a ``PUT`` with a length: socket → pipe → file with ``splice``, then ``fsync`` and a rename).
* ``serve-form``: the same server; ``curl -F file=@FILE URL/`` (``multipart/form-data``, parsed by
  python-multipart in the server's pool, written with ``pwrite``, ``fsync``, link).
* ``serve-ietf``, ``serve-tus``: the same server, a resumable upload: a creation (``PUT`` with
  ``Upload-Complete: ?0``; tus's ``POST``), then the whole file in one ``PATCH`` by ``curl -T``
  (spliced into the partial file, flushed, linked); both requests timed and counted.
* ``uploadserver``: ``python -m uploadserver`` (PyPI; installed in its own virtualenv under
  ``~/.cache/aiosendfile-bench`` when missing: a thread per connection, the standard library's
  ``cgi`` form parser into a temporary file in DIR, then a rename); ``curl -F files=@FILE
  URL/upload``. It takes forms only (its ``PUT`` is a form too).
* ``nginx-dav``: nginx with ``dav_methods PUT`` (its DAV module, where the installed nginx has it),
  the body in a temporary file in DIR then renamed; ``curl -T``. No ``fsync``.

The target is ``--target DIR`` (default: a new directory in the system's temporary directory)
or, with ``--tmpfs`` (root), a tmpfs mounted for the run: the disk out of the figures. Every
round runs each contender once, the order rotating, after one upload each not counted (a
warm-up: the source in the page cache, the servers' pools started); before each upload the previous file is
removed and the page cache written back (``sync``, not timed); after it the landed file's size and
SHA-256 are checked. The servers are pinned to CPU 0 and curl to CPU 1.

Figures per contender: MB/s (size over curl's ``time_total``) and the server's CPU seconds per GB
(user + system of its process tree over the upload, from /proc); medians and ranges over the
rounds, and each round's ratio to ``uploadserver`` and to ``nginx-dav`` (medians of the per-round
ratios).

Run from the repository root::

    python -m benchmarks.upload --size 1GiB --rounds 5 [--tmpfs] [--json out.json]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import servers
from benchmarks.harness.cli import comma_list, rotated
from benchmarks.harness.measure import process_tree, tree_cpu
from benchmarks.harness.report import cpu_model

CONTENDERS = ("serve-put", "serve-form", "serve-ietf", "serve-tus", "uploadserver", "nginx-dav")
NAME = "upload.bin"
SERVER_CPU, CLIENT_CPU = "0", "1"
UPLOADSERVER_VENV = Path.home() / ".cache" / "aiosendfile-bench" / "uploadserver-venv"

NGINX_DAV_CONF = """{user}daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {root}/.nginx-body;
    client_max_body_size 0;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        dav_methods PUT;
        dav_access user:rw group:r all:r;
    }}
}}
"""


def parse_size(text: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def make_source(path: Path, size: int) -> str:
    """A file of *size* random bytes (kept between runs of the same size); its SHA-256."""
    if not path.exists() or path.stat().st_size != size:
        with open(path, "wb") as f:
            left = size
            while left:
                chunk = os.urandom(min(left, 8 * 2**20))
                f.write(chunk)
                left -= len(chunk)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * 2**20):
            digest.update(block)
    return digest.hexdigest()


def nginx_has_dav(nginx: str) -> bool:
    done = subprocess.run([nginx, "-V"], capture_output=True, text=True)
    return "--with-http_dav_module" in done.stderr + done.stdout


def ensure_uploadserver() -> tuple[str | None, str]:
    """(the python of a virtualenv with uploadserver, "") or (None, why not)."""
    python = UPLOADSERVER_VENV / "bin" / "python"
    if not python.exists():
        print(f"upload: installing uploadserver into {UPLOADSERVER_VENV}", flush=True)
        made = subprocess.run([sys.executable, "-m", "venv", str(UPLOADSERVER_VENV)], capture_output=True)
        if made.returncode != 0:
            return None, f"cannot make a virtualenv: {made.stderr.decode(errors='replace')[-300:]}"
    check = subprocess.run([str(python), "-c", "import uploadserver"], capture_output=True)
    if check.returncode != 0:
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", "uploadserver"], capture_output=True)
        if pip.returncode != 0:
            return None, f"pip install uploadserver failed: {pip.stderr.decode(errors='replace')[-300:]}"
    return str(python), ""


def start(name: str, target: Path, work: Path, tools: dict[str, str]) -> servers.Server:
    port = servers.free_port()
    log = work / f"{name}.log"
    if name.startswith("serve"):
        cmd = [sys.executable, "-m", "aiosendfile", "serve", str(target), "--port", str(port)]
        cmd += ["--upload", "--overwrite", "--no-listing"]
        return servers.start_server(name, cmd, port, log, cpus=SERVER_CPU, env=servers.repo_env())
    if name == "uploadserver":
        cmd = [tools["uploadserver"], "-m", "uploadserver", str(port), "-b", "127.0.0.1"]
        cmd += ["-d", str(target), "--allow-replace"]
        return servers.start_server(name, cmd, port, log, cpus=SERVER_CPU, stop_signal=signal.SIGINT)
    ngx = work / "nginx"
    ngx.mkdir(exist_ok=True)
    user = "user root;\n" if os.geteuid() == 0 else ""
    (target / ".nginx-body").mkdir(exist_ok=True)
    conf = ngx / "nginx.conf"
    conf.write_text(NGINX_DAV_CONF.format(user=user, tmp=ngx, root=target, port=port))
    cmd = [tools["nginx"], "-p", str(ngx), "-c", str(conf), "-e", str(ngx / "error.log")]
    return servers.start_server(
        name,
        cmd,
        port,
        log,
        cpus=SERVER_CPU,
        processes=2,
        stop_signal=signal.SIGQUIT,
        error_log=ngx / "error.log",
    )


def curl_command(name: str, source: Path, port: int) -> list[str]:
    url = f"http://127.0.0.1:{port}"
    out = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{time_total}"]
    if name in ("serve-put", "nginx-dav"):
        return [*out, "-T", str(source), f"{url}/{NAME}"]
    if name == "serve-form":
        return [*out, "-F", f"file=@{source};filename={NAME}", f"{url}/"]
    return [*out, "-F", f"files=@{source};filename={NAME}", f"{url}/upload"]


def creation_command(name: str, size: int, port: int) -> list[str]:
    """A resumable upload's creation (``serve-ietf``, ``serve-tus``): its answer's status, time and
    ``Location``."""
    out = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{time_total} %header{location}"]
    if name == "serve-ietf":
        fields = ["-X", "PUT", "-H", "Upload-Complete: ?0", "-H", f"Upload-Length: {size}"]
        return [*out, *fields, f"http://127.0.0.1:{port}/{NAME}"]
    metadata = "filename " + base64.b64encode(NAME.encode()).decode()
    fields = ["-X", "POST", "-H", "Tus-Resumable: 1.0.0", "-H", f"Upload-Length: {size}"]
    return [*out, *fields, "-H", f"Upload-Metadata: {metadata}", f"http://127.0.0.1:{port}/"]


def append_command(name: str, source: Path, port: int, location: str) -> list[str]:
    """The one ``PATCH`` that sends the whole file to the upload at *location*."""
    out = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{time_total}", "-X", "PATCH"]
    if name == "serve-ietf":
        fields = ["-H", "Content-Type: application/partial-upload", "-H", "Upload-Complete: ?1"]
    else:
        fields = ["-H", "Content-Type: application/offset+octet-stream", "-H", "Tus-Resumable: 1.0.0"]
    return [*out, *fields, "-H", "Upload-Offset: 0", "-T", str(source), f"http://127.0.0.1:{port}{location}"]


def one_upload(
    name: str, server: servers.Server, source: Path, target: Path, size: int, sha: str
) -> dict[str, Any]:
    landed = target / NAME
    landed.unlink(missing_ok=True)
    subprocess.run(["sync"], check=False)
    pids = process_tree(server.proc.pid)
    before = tree_cpu(pids)
    made = 0.0
    command = curl_command(name, source, server.port) if name in _PLAIN else []
    if not command:  # (a resumable upload: made first, then sent)
        first = subprocess.run(
            [*servers.pin_prefix(CLIENT_CPU), *creation_command(name, size, server.port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        code, seconds, location = [*first.stdout.split(" ", 2), "", ""][:3]
        if first.returncode != 0 or code != "201" or not location.strip():
            raise RuntimeError(f"{name}: the creation answered {first.stdout!r} {first.stderr.strip()!r}")
        made = float(seconds)
        command = append_command(name, source, server.port, location.strip())
    done = subprocess.run(
        [*servers.pin_prefix(CLIENT_CPU), *command],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    after = tree_cpu(pids)
    code, _, seconds = done.stdout.partition(" ")
    seconds = str(float(seconds or "nan") + made)
    if done.returncode != 0 or not code.startswith(("2", "3")):
        raise RuntimeError(f"{name}: curl {done.returncode} {done.stdout!r} {done.stderr.strip()!r}")
    got = landed.stat().st_size if landed.exists() else -1
    if got != size or _sha256(landed) != sha:
        raise RuntimeError(f"{name}: the file landed with {got} of {size} bytes, or other bytes")
    cpu = (after[0] - before[0]) + (after[1] - before[1])
    return {
        "status": int(code),
        "seconds": float(seconds),
        "mb_s": size / 1e6 / float(seconds),
        "cpu_s": cpu,
        "cpu_s_per_gb": cpu / (size / 1e9),
        "user_s": after[0] - before[0],
        "sys_s": after[1] - before[1],
    }


_PLAIN = ("serve-put", "serve-form", "uploadserver", "nginx-dav")


def _server_of(name: str) -> str:
    """The server a contender uploads to (``serve-put`` and ``serve-form`` share one)."""
    return "serve" if name.startswith("serve") else name


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 * 2**20):
            digest.update(block)
    return digest.hexdigest()


def _median_range(values: list[float], fmt: Callable[[float], str]) -> str:
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


def report(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| contender | MB/s, median (range) | server CPU s/GB | x uploadserver | x nginx-dav |",
        "|---|---|---|---|---|",
    ]
    for name, rows in results.items():
        if not rows:
            continue
        speed = _median_range([r["mb_s"] for r in rows], lambda v: f"{v:,.0f}")
        cpu = _median_range([r["cpu_s_per_gb"] for r in rows], lambda v: f"{v:.2f}")
        ratios = []
        for peer in ("uploadserver", "nginx-dav"):
            theirs = results.get(peer) or []
            pairs = [a["mb_s"] / b["mb_s"] for a, b in zip(rows, theirs, strict=False)]
            cpus = [
                a["cpu_s_per_gb"] / b["cpu_s_per_gb"]
                for a, b in zip(rows, theirs, strict=False)
                if b["cpu_s_per_gb"]
            ]
            ratios.append(
                f"{statistics.median(pairs):.2f}x (CPU {statistics.median(cpus):.2f}x)"
                if pairs and cpus
                else "-"
            )
        lines.append(f"| {name} | {speed} | {cpu} | {ratios[0]} | {ratios[1]} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.upload", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=parse_size, default=2**30, help="bytes per upload (default 1GiB)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="a comma-separated list")
    p.add_argument("--target", type=Path, help="the directory uploads land in (default: a new temporary one)")
    p.add_argument("--tmpfs", action="store_true", help="mount a tmpfs as the target (root): the disk out")
    p.add_argument("--json", type=Path, help="write the rounds and the summary here")
    args = p.parse_args(argv)
    args.contenders = comma_list(p, args.contenders, CONTENDERS)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not shutil.which("curl"):
        raise SystemExit("upload: needs curl (apt-get install -y curl)")
    work = Path(tempfile.mkdtemp(prefix="aiosendfile-upload-bench-"))
    tools: dict[str, str] = {}
    names, skipped = [], {}
    for name in args.contenders:
        if name == "uploadserver":
            python, why = ensure_uploadserver()
            if python is None:
                skipped[name] = why
                continue
            tools[name] = python
        elif name == "nginx-dav":
            nginx = servers.find_nginx()
            if nginx is None or not nginx_has_dav(nginx):
                why = "no nginx found" if nginx is None else "the installed nginx has no DAV module"
                skipped[name] = why
                continue
            tools["nginx"] = nginx
        names.append(name)
    target = args.target or work / "target"
    target.mkdir(parents=True, exist_ok=True)
    mounted = False
    try:
        if args.tmpfs:
            size_opt = f"size={args.size * 2 + 2**27}"
            subprocess.run(["mount", "-t", "tmpfs", "-o", size_opt, "tmpfs", str(target)], check=True)
            mounted = True
        source = work / "source.bin"
        print(f"upload: {args.size:,} bytes of random data in {source}", flush=True)
        sha = make_source(source, args.size)
        running = {
            server: start(server, target, work, tools) for server in dict.fromkeys(map(_server_of, names))
        }
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        try:
            for name in names:  # a warm-up, not counted: the source in the page cache, pools started
                one_upload(name, running[_server_of(name)], source, target, args.size, sha)
            for rnd in range(args.rounds):
                for name in rotated(names, rnd + 1):
                    row = one_upload(name, running[_server_of(name)], source, target, args.size, sha)
                    results[name].append(row)
                    speed, cpu = f"{row['mb_s']:,.0f} MB/s", f"server CPU {row['cpu_s_per_gb']:.2f} s/GB"
                    split = f"user {row['user_s']:.2f} s, sys {row['sys_s']:.2f} s"
                    print(f"round {rnd + 1} {name}: {speed}, {cpu} ({split})", flush=True)
        finally:
            for server in running.values():
                servers.stop_server(server)
            (target / NAME).unlink(missing_ok=True)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(target)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    where = "tmpfs" if args.tmpfs else str(target)
    print(f"\nCPU: {cpu_model()}; {args.size:,} bytes a round, {args.rounds} rounds; target: {where}")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print(report(results))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cpu": cpu_model(),
                    "size": args.size,
                    "target": where,
                    "skipped": skipped,
                    "rounds": results,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
