"""Folder archive benchmark: a folder of about 1 GiB downloaded as a tar archive by ``curl``, from
each server that makes one, interleaved.

Contenders:

* ``serve``: ``python -m aiosendfile serve ROOT``; ``GET /folder/?tar`` (headers made in memory,
  each larger member's bytes by ``sendfile``, small ones read in the pool; an exact length).
* ``serve-zip``: the same server, ``GET /folder/?zip``: a stored zip, each file's CRC-32 read in
  the pool before its header (kept by the file's identity: after the first download, which is not
  counted, the rounds send without reading the files first).
* ``serve-tls``: the same over HTTPS (``--tls-cert``, a certificate made by ``trustme``): the
  bounded userspace copy every HTTPS body takes.
* ``tar-pipe``: ``benchmarks/programs/tar_pipe_server.py``: GNU ``tar -cf -`` into a pipe, copied
  to the socket, the way servers without zero-copy stream a tar (miniserve's tar is a userspace
  copy too; miniserve and dufs themselves are Rust programs, not installable where crates.io
  cannot be reached).

The folder (``--files``/``--small``: 96 files of 10 MiB and 1,000 of 64 KiB by default, random
bytes) is made once under ``--work``. Before each download the folder is read through (its pages
in the cache: the disk out of the figures). Servers on CPU 0, curl on CPU 1. Figures: MB/s (bytes
over curl's ``time_total``) and the server's CPU seconds per GB (user + system of its process and
of the children it waited for: ``tar`` for ``tar-pipe``); medians and ranges over the rounds,
and each round's ratio to ``tar-pipe``. Every download's bytes are counted; the first of each contender is
checked with ``tarfile`` against the folder's names and sizes.

    python -m benchmarks.archive [--rounds 5] [--contenders serve,serve-zip,serve-tls,tar-pipe] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from benchmarks.harness import servers
from benchmarks.harness.cli import comma_list, rotated
from benchmarks.harness.measure import CLK_TCK, proc_stat
from benchmarks.harness.report import cpu_model

CONTENDERS = ("serve", "serve-zip", "serve-tls", "tar-pipe")
SERVER_CPU, CLIENT_CPU = "0", "1"
FOLDER = "folder"


def make_folder(root: Path, big: int, small: int) -> tuple[int, dict[str, int]]:
    """ROOT/folder with *big* files of 10 MiB and *small* of 64 KiB (kept between runs); its bytes
    and each file's size by archive name."""
    top = root / FOLDER
    (top / "small").mkdir(parents=True, exist_ok=True)
    want = {f"big-{i:03}.bin": 10 * 2**20 for i in range(big)}
    want |= {f"small/s-{i:04}.bin": 64 * 2**10 for i in range(small)}
    for name, size in want.items():
        path = top / name
        if not path.exists() or path.stat().st_size != size:
            path.write_bytes(os.urandom(size))
    return sum(want.values()), {f"{FOLDER}/{name}": size for name, size in want.items()}


def warm(root: Path) -> None:
    for dirpath, _, files in os.walk(root / FOLDER):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                while f.read(8 * 2**20):
                    pass


def start(name: str, root: Path, work: Path, cert: Path | None) -> servers.Server:
    port = servers.free_port()
    log = work / f"{name}.log"
    if name.startswith("serve"):  # (serve-zip asks the serve server; see _server_of)
        cmd = [sys.executable, "-m", "aiosendfile", "serve", str(root), "--port", str(port)]
        if name == "serve-tls":
            assert cert is not None
            cmd += ["--tls-cert", str(cert)]
        return servers.start_server(name, cmd, port, log, cpus=SERVER_CPU, env=servers.repo_env())
    cmd = [sys.executable, "-m", "benchmarks.programs.tar_pipe_server", str(root), str(port)]
    return servers.start_server(name, cmd, port, log, cpus=SERVER_CPU, env=servers.repo_env())


def download(name: str, server: servers.Server, ca: Path | None, keep: Path | None) -> dict[str, Any]:
    scheme = "https" if name == "serve-tls" else "http"
    url = f"{scheme}://localhost:{server.port}/{FOLDER}/?{'zip' if name == 'serve-zip' else 'tar'}"
    cmd = [
        "curl",
        "-sS",
        "-o",
        str(keep) if keep else "/dev/null",
        "-w",
        "%{http_code} %{size_download} %{time_total}",
    ]
    if ca is not None:
        cmd += ["--cacert", str(ca)]
    before = _server_cpu(server.proc.pid)
    done = subprocess.run(
        [*servers.pin_prefix(CLIENT_CPU), *cmd, url], capture_output=True, text=True, timeout=3600
    )
    after = _server_cpu(server.proc.pid)
    code, size, seconds = done.stdout.split()
    if done.returncode != 0 or code != "200":
        raise RuntimeError(f"{name}: curl {done.returncode} {done.stdout!r} {done.stderr.strip()!r}")
    cpu = (after[0] - before[0]) + (after[1] - before[1])
    got = int(size)
    return {
        "bytes": got,
        "seconds": float(seconds),
        "mb_s": got / 1e6 / float(seconds),
        "cpu_s_per_gb": cpu / (got / 1e9),
        "user_s": after[0] - before[0],
        "sys_s": after[1] - before[1],
    }


def _server_cpu(pid: int) -> tuple[float, float]:
    """(user, sys) CPU seconds of the server so far, its threads and its children waited for
    included (``tar-pipe``'s ``tar`` is one of those by the end of a download)."""
    stat = proc_stat(pid)
    if stat is None:
        raise RuntimeError(f"the server {pid} is gone")
    return (int(stat[11]) + int(stat[13])) / CLK_TCK, (int(stat[12]) + int(stat[14])) / CLK_TCK


def check(name: str, path: Path, sizes: dict[str, int]) -> None:
    """The archive lists every file of the folder at its size (tarfile; zipfile, CRCs checked)."""
    if name == "serve-zip":
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
            if bad is not None:
                raise RuntimeError(f"{name}: {bad} has another CRC-32")
            got = {i.filename: i.file_size for i in zf.infolist() if not i.is_dir()}
    else:
        with tarfile.open(path) as tf:
            got = {m.name: m.size for m in tf if m.isfile()}
    if got != sizes:
        missing = set(sizes) ^ set(got)
        raise RuntimeError(f"{name}: the archive's files differ from the folder's: {sorted(missing)[:5]}")


def report(results: dict[str, list[dict[str, Any]]]) -> str:
    def med(values: list[float], fmt: str) -> str:
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

    lines = ["| contender | MB/s, median (range) | server CPU s/GB | x tar-pipe (CPU) |", "|---|---|---|---|"]
    base = results.get("tar-pipe") or []
    for name, rows in results.items():
        if not rows:
            continue
        ratio = "-"
        if base and name != "tar-pipe":
            speed = [a["mb_s"] / b["mb_s"] for a, b in zip(rows, base, strict=False)]
            cpu = [a["cpu_s_per_gb"] / b["cpu_s_per_gb"] for a, b in zip(rows, base, strict=False)]
            ratio = f"{statistics.median(speed):.2f}x ({statistics.median(cpu):.2f}x)"
        speeds = med([r["mb_s"] for r in rows], ",.0f")
        cpus = med([r["cpu_s_per_gb"] for r in rows], ".3f")
        lines.append(f"| {name} | {speeds} | {cpus} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.archive", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--contenders", default=",".join(CONTENDERS), help="a comma-separated list")
    p.add_argument("--files", type=int, default=96, help="10 MiB files in the folder (default 96)")
    p.add_argument("--small", type=int, default=1000, help="64 KiB files in folder/small (default 1000)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "aiosendfile-archive-bench")
    p.add_argument("--json", type=Path, help="write the rounds and the summary here")
    args = p.parse_args(argv)
    names = comma_list(p, args.contenders, CONTENDERS)
    if not shutil.which("curl") or not shutil.which("tar"):
        raise SystemExit("archive: needs curl and tar")
    root = args.work / "root"
    total, sizes = make_folder(root, args.files, args.small)
    print(f"archive: {root / FOLDER}: {total:,} bytes in {len(sizes):,} files", flush=True)
    cert = ca = None
    if "serve-tls" in names:
        import trustme

        authority = trustme.CA()
        issued = authority.issue_cert("localhost")
        cert, ca = args.work / "cert.pem", args.work / "ca.pem"
        issued.private_key_and_cert_chain_pem.write_to_path(str(cert))
        authority.cert_pem.write_to_path(str(ca))
    servers_of = {name: "serve" if name == "serve-zip" else name for name in names}
    started = {s: start(s, root, args.work, cert) for s in dict.fromkeys(servers_of.values())}
    running = {name: started[servers_of[name]] for name in names}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    try:
        for name in names:  # a warm-up, checked, not counted
            warm(root)
            kept = args.work / f"{name}.tar"
            download(name, running[name], ca if name == "serve-tls" else None, kept)
            check(name, kept, sizes)
            kept.unlink()
        for rnd in range(args.rounds):
            for name in rotated(names, rnd + 1):
                warm(root)
                row = download(name, running[name], ca if name == "serve-tls" else None, None)
                results[name].append(row)
                speed, cpu = f"{row['mb_s']:,.0f} MB/s", f"server CPU {row['cpu_s_per_gb']:.3f} s/GB"
                split = f"user {row['user_s']:.2f} s, sys {row['sys_s']:.2f} s"
                print(f"round {rnd + 1} {name}: {speed} ({split}), {cpu}", flush=True)
    finally:
        for server in started.values():
            servers.stop_server(server)
    print(f"\nCPU: {cpu_model()}; {total:,} bytes in {len(sizes):,} files, {args.rounds} rounds")
    print(report(results))
    if args.json:
        doc = {"cpu": cpu_model(), "bytes": total, "files": len(sizes), "rounds": results}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
