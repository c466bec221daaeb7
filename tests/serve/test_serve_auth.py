"""``serve --auth``: HTTP Basic authentication (``aiosendfile._serve._auth``), on both loops.

The gate's rules on their own (clear and hashed passwords, the lock-out, its bounds), then the
engine over TCP and TLS: 401 with a challenge, the right password answered, and, what matters
most, nothing memoised for an allowed request ever answers one that is not; then the command
line in its own process (the options, the banner, ``hash-password``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ..support.processes import Server
from ..support.raw_http import read_response
from ..support.serve import serve_site

pytest.importorskip("httptools")

from aiosendfile._serve import _auth
from aiosendfile._serve._auth import ALLOWED, MISSING, SLOW, AuthError, Gate

#: A cheap scrypt for tests (2**4): the rules are the same, the time is not.
FAST_LOG_N = 4


def basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


def users(**clear: str) -> dict[bytes, _auth.Secret]:
    return dict(_auth.parse_entry(f"{user}:{password}") for user, password in clear.items())


def hashed(user: str, password: str) -> tuple[bytes, _auth.Secret]:
    return _auth.parse_entry(f"{user}:{_auth.hash_password(password, log_n=FAST_LOG_N)}")


# -- the gate ------------------------------------------------------------------------------------


def test_a_password_in_clear_is_checked_at_once() -> None:
    gate = Gate(users(bob="pw"))
    assert gate.check(b"GET", basic("bob", "pw"), "a", 0.0) == ALLOWED
    assert gate.check(b"GET", basic("bob", "pW"), "b", 0.0) == MISSING
    assert gate.check(b"GET", basic("eve", "pw"), "b", 0.0) == MISSING  # (no hash: nothing to time)
    assert gate.check(b"GET", None, "c", 0.0) == MISSING
    assert "c" not in gate.failures  # (no credentials: a browser's first request, not a failure)
    assert gate.failures["b"][0] == 2


@pytest.mark.parametrize(
    "value",
    [
        b"Basic",
        b"Basic !!!not-base64!!!",
        b"Basic " + base64.b64encode(b"no colon"),
        b"Bearer " + base64.b64encode(b"bob:pw"),
        b"",
        b"Basic Ym9i*OnB3",
    ],
)
def test_malformed_credentials_are_refused_and_counted(value: bytes) -> None:
    gate = Gate(users(bob="pw"))
    assert gate.check(b"GET", value, "a", 0.0) == MISSING
    assert gate.failures["a"][0] == 1


def test_a_hashed_password_is_checked_off_the_loop_and_then_remembered() -> None:
    user, secret = hashed("alice", "s3cret")
    gate = Gate({user: secret})
    right, wrong = basic("alice", "s3cret"), basic("alice", "nope")
    assert gate.check(b"GET", right, "a", 0.0) == SLOW
    job = gate.verify_later(right, "a")
    assert not isinstance(job, float)
    assert job.result(10) == ALLOWED
    assert gate.verify(wrong) is False
    assert gate.verify(basic("eve", "s3cret")) is False  # (checked against a dummy hash: same time)
    assert gate.check(b"GET", right, "a", 0.0) == ALLOWED  # (recorded by the thread: no hash again)
    gate.close()


def test_beside_a_hashed_user_every_user_takes_a_hashs_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a hashed user, an unknown user is checked against a dummy hash: a user whose password
    was given in clear then is too (the time of a 401 would else tell that this user exists),
    right or wrong, until a right one is remembered."""
    user, secret = hashed("alice", "s3cret")
    gate = Gate({user: secret, **users(bob="pw")})
    hashes = []
    real = hashlib.scrypt
    monkeypatch.setattr(hashlib, "scrypt", lambda *a, **k: hashes.append(1) or real(*a, **k))
    for value in (basic("bob", "nope"), basic("bob", "pw"), basic("eve", "x"), basic("alice", "x")):
        assert gate.check(b"GET", value, "a", 0.0) == SLOW, value
        before = len(hashes)
        assert gate.verify(value) is (value == basic("bob", "pw"))
        assert len(hashes) == before + 1, value
    job = gate.verify_later(basic("bob", "pw"), "a")
    assert not isinstance(job, float)
    assert job.result(10) == ALLOWED
    assert gate.check(b"GET", basic("bob", "pw"), "a", 0.0) == ALLOWED  # (remembered: no hash again)
    gate.close()


def test_repeated_failures_lock_an_address_out_for_longer_each_time() -> None:
    gate = Gate(users(bob="pw"))
    bad, good = basic("bob", "bad"), basic("bob", "pw")
    for _ in range(_auth.FREE_FAILURES):
        assert gate.check(b"GET", bad, "a", 100.0) == MISSING
    # Locked: 1 s after the fifth failure, whatever it sends, the right password too
    assert gate.check(b"GET", good, "a", 100.5) == pytest.approx(0.5)
    assert gate.check(b"GET", bad, "a", 100.5) == pytest.approx(0.5)
    assert gate.check(b"GET", good, "other", 100.5) == ALLOWED  # (another address is not locked)
    assert gate.check(b"GET", bad, "a", 101.1) == MISSING  # past it: a sixth failure, 2 s now
    assert gate.check(b"GET", good + b" ", "a", 102.0) == pytest.approx(1.1)  # (a value not seen)
    assert gate.check(b"GET", bad, "a", 103.2) == MISSING  # a seventh: 4 s
    assert gate.locked_for("a", 103.2) == pytest.approx(4.0)
    for n in range(30):  # capped
        gate.record(bad, False, "a", 200.0 + n)
    assert gate.locked_for("a", 229.0) == pytest.approx(_auth.LOCK_MAX)
    # A value that passed before does not pass while locked either: a lock that let a known value
    # through would let an address test guesses against the values others use, at line rate
    gate.record(good, True, "other", 229.0)
    assert gate.check(b"GET", good, "a", 229.0) == pytest.approx(_auth.LOCK_MAX)
    assert gate.failures["a"][0] == _auth.COUNT_MAX
    # A success clears the address; a failure long ago is forgotten
    gate.record(good, True, "a", 300.0)
    assert gate.locked_for("a", 300.0) == 0.0
    for _ in range(_auth.FREE_FAILURES - 1):
        gate.record(bad, False, "b", 0.0)
    gate.record(bad, False, "b", _auth.FORGET_AFTER + 1)
    assert gate.failures["b"][0] == 1


def test_a_hostile_peer_cannot_grow_the_gates_memory() -> None:
    """Addresses tracked and values remembered are bounded in entries, and a long value is never
    kept: a flood of new addresses or of right-but-padded values stays within the bounds."""
    gate = Gate(users(bob="pw"))
    for i in range(_auth.ADDRESSES_MAX * 2):
        gate.check(b"GET", basic("bob", f"guess{i}"), f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}", 0.0)
    assert len(gate.failures) == _auth.ADDRESSES_MAX
    good = basic("bob", "pw")
    for i in range(_auth.VERIFIED_MAX * 2):
        gate.check(b"GET", good + b" " * i, "x", 0.0)  # (spaces around the token: the same password)
    assert list(gate.verified) == [good]  # (only its canonical spelling is kept)
    many = Gate(users(**{f"u{i}": "pw" for i in range(_auth.VERIFIED_MAX * 2)}))
    for i in range(_auth.VERIFIED_MAX * 2):
        many.check(b"GET", basic(f"u{i}", "pw"), "x", 0.0)
    assert len(many.verified) == _auth.VERIFIED_MAX
    assert all(len(v) <= _auth.VERIFIED_MAX_VALUE for v in gate.verified)
    gate.record(b"Basic " + b"A" * 4096, True, "x", 0.0)
    assert b"Basic " + b"A" * 4096 not in gate.verified


def test_public_read_leaves_get_and_head_open() -> None:
    gate = Gate(users(bob="pw"), public_read=True)
    assert gate.check(b"GET", None, "a", 0.0) == ALLOWED
    assert gate.check(b"HEAD", None, "a", 0.0) == ALLOWED
    assert gate.check(b"PUT", None, "a", 0.0) == MISSING


def test_hashes_and_entries_are_read_or_refused_with_a_reason(tmp_path: Path) -> None:
    line = _auth.hash_password("pw", log_n=FAST_LOG_N)
    assert line.startswith("$scrypt$ln=4,r=8,p=1$")
    user, secret = _auth.parse_entry(f"bob:{line}")
    assert (user, secret.slow) == (b"bob", True)
    assert secret.matches(b"pw")
    assert not secret.matches(b"pW")
    for bad, why in [
        ("bob", "expected USER:PASSWORD"),
        (":pw", "expected USER:PASSWORD"),
        ("bob:", "empty"),
        ("bo\x07b:pw", "control"),
        ("bob:$scrypt$ln=4$x", "hash is"),
        ("bob:$scrypt$ln=4$x$y", "cannot be read"),
        ("bob:$scrypt$ln=99,r=8,p=1$AAAA$AAAAAAAAAAAAAAAAAAAAAA", "out of range"),
        ("bob:$scrypt$ln=4,r=8,p=1$!!$AAAA", "cannot be read"),
    ]:
        with pytest.raises(AuthError, match=why):
            _auth.parse_entry(bad)
    users_file = tmp_path / "users"
    users_file.write_text(f"# who may come in\n\nbob:{line}\nalice:clear-text\n")
    with pytest.raises(AuthError, match="line 4: expected USER:\\$scrypt"):
        _auth.read_auth_file(str(users_file))
    users_file.write_text(f"# who may come in\n\nbob:{line}\n")
    assert list(_auth.read_auth_file(str(users_file))) == [b"bob"]


# -- the engine ------------------------------------------------------------------------------------


def _public(tmp_path: Path) -> Path:
    public = tmp_path / "public"
    (public / "sub").mkdir(parents=True)
    (public / "a.txt").write_bytes(os.urandom(4096))
    (public / "big.bin").write_bytes(os.urandom(3 * 2**20 + 5))
    (public / "sub" / "b.txt").write_text("b")
    return public


def _get(path: str, auth: bytes | None = None, method: str = "GET") -> bytes:
    extra = b"Authorization: " + auth + b"\r\n" if auth is not None else b""
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n".encode() + extra + b"\r\n"


async def test_nothing_is_answered_without_the_password_and_nothing_memoised_leaks(
    tmp_path: Path, site_kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """401 with a Basic challenge (kept alive: the browser asks again on the connection), then
    the right password gets the bytes. Once a file is memoised (its path, its exact request read),
    a request without credentials, with wrong ones, or another spelling of it is still refused:
    the memos only learn allowed reads."""
    monkeypatch.setattr(_auth, "FREE_FAILURES", 100)  # (no lock-out here: its own test)
    public = _public(tmp_path)
    small = (public / "a.txt").read_bytes()
    good, bad = basic("bob", "pw"), basic("bob", "nope")
    async with serve_site(
        public, auth=tuple(users(bob="pw").items()), show_index=True, **site_kwargs
    ) as site:
        reader, writer = await site.open()
        try:
            for path, body in [("/a.txt", small), ("/big.bin", (public / "big.bin").read_bytes())]:
                writer.write(_get(path))
                answer = await read_response(reader)
                assert answer.status == 401
                assert b'\r\nWWW-Authenticate: Basic realm="aiosendfile", charset="UTF-8"\r\n' in answer.raw
                assert answer.raw.endswith(b"401: Unauthorized")
                for _ in range(3):  # (memoised after the first)
                    writer.write(_get(path, good))
                    answer = await read_response(reader)
                    assert answer.status == 200
                    assert answer.raw.endswith(body)
                for attempt in (None, bad, basic("bob", ""), basic("", "pw")):
                    writer.write(_get(path, attempt))
                    assert (await read_response(reader)).status == 401, attempt
                writer.write(_get(path, method="HEAD"))
                assert (await read_response(reader, b"HEAD")).status == 401
            for path in ("/", "/sub/", "/./a.txt", "/a.txt?x", "/nope"):
                writer.write(_get(path))
                assert (await read_response(reader)).status == 401, path
            writer.write(_get("/sub/", good))
            assert b'<a href="b.txt">b.txt</a>' in (await read_response(reader)).raw
        finally:
            writer.close()


async def test_a_hashed_password_is_checked_off_the_loop_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user from a hash: the first request waits for scrypt in the gate's thread while the
    loop answers others; pipelined requests behind it keep their order; a wrong password is 401."""
    public = _public(tmp_path)
    small = (public / "a.txt").read_bytes()
    calls = []
    real = Gate.verify

    def verify(self: Gate, value: bytes) -> bool:
        calls.append(value)
        return real(self, value)

    monkeypatch.setattr(Gate, "verify", verify)
    async with serve_site(public, auth=(hashed("alice", "s3cret"),)) as site:
        reader, writer = await site.open()
        try:
            good = basic("alice", "s3cret")
            writer.write(
                _get("/a.txt", good) + _get("/sub/b.txt", good) + _get("/a.txt", basic("alice", "x"))
            )
            first, second, third = [await read_response(reader) for _ in range(3)]
            assert (first.status, second.status, third.status) == (200, 200, 401)
            assert first.raw.endswith(small)
            assert second.raw.endswith(b"\r\n\r\nb")
            assert calls == [good, basic("alice", "x")]  # (the second: passed meanwhile, no hash)
        finally:
            writer.close()


async def test_an_address_that_keeps_failing_gets_429_with_retry_after(tmp_path: Path) -> None:
    public = _public(tmp_path)
    async with serve_site(public, auth=tuple(users(bob="pw").items())) as site:
        reader, writer = await site.open()
        try:
            got = []
            for i in range(_auth.FREE_FAILURES + 2):
                writer.write(_get("/a.txt", basic("bob", f"guess{i}")))
                got.append(await read_response(reader))
            assert [r.status for r in got] == [401] * _auth.FREE_FAILURES + [429, 429]
            assert b"\r\nRetry-After: 1\r\n" in got[-1].raw
            writer.write(_get("/a.txt", basic("bob", "pw")))
            assert (await read_response(reader)).status == 429  # (a new right password waits too)
            await asyncio.sleep(1.1)
            writer.write(_get("/a.txt", basic("bob", "pw")))
            assert (await read_response(reader)).status == 200
        finally:
            writer.close()


async def test_public_read_serves_reads_without_a_password(tmp_path: Path) -> None:
    public = _public(tmp_path)
    async with serve_site(public, auth=tuple(users(bob="pw").items()), public_read=True) as site:
        reader, writer = await site.open()
        try:
            writer.write(_get("/a.txt"))
            assert (await read_response(reader)).raw.endswith((public / "a.txt").read_bytes())
        finally:
            writer.close()


@pytest.mark.parametrize("public_read", [False, True])
async def test_answers_given_behind_a_password_are_for_no_shared_cache(
    tmp_path: Path, public_read: bool
) -> None:
    """Every answer of a server whose reads need a password says ``Cache-Control: private``: a
    caching proxy in front (nginx with ``proxy_cache_valid 200``, which stores answers to requests
    with ``Authorization`` regardless) gave a logged-in user's file to anyone (a review). With
    ``--public-read`` reads are anyone's, and say nothing of it."""
    public = _public(tmp_path)
    async with serve_site(public, auth=tuple(users(bob="pw").items()), public_read=public_read) as site:
        reader, writer = await site.open()
        try:
            for _ in range(3):  # (the first sight, then the answer cache's)
                writer.write(_get("/a.txt", basic("bob", "pw")))
                answer = await read_response(reader)
                assert answer.status == 200
                assert answer.headers.get("Cache-Control") == (None if public_read else "private")
        finally:
            writer.close()


# -- the command line ------------------------------------------------------------------------------


def _serve(*options: str, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiosendfile", *options],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def test_hash_password_prints_a_line_serve_takes(tmp_path: Path) -> None:
    done = _serve("hash-password", "alice", stdin="s3cret\n")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("alice:$scrypt$ln=14,r=8,p=1$")
    users_file = tmp_path / "users"
    users_file.write_text(line + "\n")
    public = _public(tmp_path)
    server = Server(str(public), "--port", "0", "--auth-file", str(users_file), "--auth", "bob:pw")
    try:
        assert server.proc.stdout is not None
        assert (
            server.proc.stdout.readline().strip()
            == "passwords (HTTP Basic): 2 users; every request needs one"
        )
        assert server.get("/a.txt")[0] == 401
        for user, password in (("alice", "s3cret"), ("bob", "pw")):
            status, _, body = server.get("/a.txt", Authorization=basic(user, password).decode())
            assert (status, body) == (200, (public / "a.txt").read_bytes())
        assert server.interrupt() == 0
    finally:
        server.close()


def test_the_banner_warns_of_clear_text_passwords_off_loopback(tmp_path: Path) -> None:
    server = Server(str(_public(tmp_path)), "--host", "0.0.0.0", "--port", "0", "--auth", "bob:pw")
    try:
        assert server.proc.stdout is not None
        assert "2 users" not in server.proc.stdout.readline()
        assert "clear text: add --tls-cert FILE" in server.proc.stdout.readline()
        assert server.interrupt() == 0
    finally:
        server.close()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--auth", "bob"], "cannot use --auth bob:...: expected USER:PASSWORD"),
        (["--auth", "bob:"], "cannot use --auth bob:...: the password is empty"),
        (["--auth-file", "/nonexistent/users"], "cannot use --auth-file /nonexistent/users: no such file"),
        # (no user at all, what a failed `hash-password alice > users` leaves: it served everyone)
        (["--auth-file", "/dev/null"], "cannot use --auth-file /dev/null: it holds no USER:HASH line"),
        (["--public-read"], "--public-read needs --auth or --auth-file"),
    ],
)
def test_bad_auth_options_are_one_line_and_exit_2(tmp_path: Path, options: list[str], says: str) -> None:
    done = _serve("serve", str(_public(tmp_path)), "--port", "0", *options)
    assert done.returncode == 2
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_hash_password_says_in_words_what_it_cannot_do(tmp_path: Path) -> None:
    """A password that is no UTF-8, a full stdout: one line and a status, no traceback."""
    import subprocess
    import sys

    from ..support.pair import ENV

    def hashed(stdin: bytes, **how: object) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "aiosendfile", "hash-password", "bob"]
        return subprocess.run(
            command, input=stdin, capture_output="stdout" not in how, env=ENV, timeout=30, **how
        )  # type: ignore[call-overload, no-any-return]

    user = subprocess.run(
        [sys.executable, "-m", "aiosendfile", "hash-password", b"\xff"],
        input=b"pw\n",
        capture_output=True,
        env=ENV,
        timeout=30,
    )
    assert (user.returncode, user.stderr.decode().strip()) == (
        2,
        "aiosendfile hash-password: cannot use the user: it is not UTF-8 text",
    )
    not_utf8 = hashed(b"\xff\n")
    assert (not_utf8.returncode, not_utf8.stderr.decode().strip()) == (
        2,
        "aiosendfile hash-password: the password is not UTF-8 text",
    )
    with open("/dev/full", "wb") as full:
        done = hashed(b"pw\n", stdout=full, stderr=subprocess.PIPE)
    assert done.returncode == 1
    assert (
        done.stderr.decode().strip()
        == "aiosendfile hash-password: cannot write the line to stdout: the disk is full"
    )


def test_hash_password_refuses_what_it_cannot_use() -> None:
    colon = _serve("hash-password", "al:ice", stdin="x\n")
    assert colon.returncode == 2
    assert "':'" in colon.stderr
    empty = _serve("hash-password", "alice", stdin="\n")
    assert empty.returncode == 2
    assert "empty" in empty.stderr
