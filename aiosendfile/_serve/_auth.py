"""``serve --auth``: HTTP Basic authentication, decided before anything is answered.

Who may come in: users from ``--auth USER:PASSWORD`` (the password as given, or a hash) and
``--auth-file`` (one ``user:hash`` a line). A hash is scrypt (the standard library's
``hashlib.scrypt``) in the PHC string format ``$scrypt$ln=14,r=8,p=1$SALT$HASH`` (base64, no
padding); :func:`hash_password` makes one (``aiosendfile hash-password USER`` prints the line).

:class:`Gate` decides a request from its ``Authorization`` value, on the loop, without waiting:

* a value that passed before (:data:`VERIFIED_MAX` kept, the least recently used out first) or a
  password given in clear that matches (a SHA-256 of each side compared in constant time):
  allowed;
* no value: 401, and nothing counted against the address;
* an address whose credentials failed :data:`FREE_FAILURES` times is locked out for 1 s after
  that failure, twice as long after each further one, up to :data:`LOCK_MAX` seconds: 429 with
  ``Retry-After``, whatever it sends meanwhile but a value that passed before (a new right
  password too: a lock that let it through would tell it is right). A success clears the
  address. :data:`ADDRESSES_MAX` addresses are tracked, the least recently failed out first,
  each forgotten :data:`FORGET_AFTER` seconds after its last failure. Malformed credentials count
  as a failure; a request with none does not (a browser's first);
* anything else is checked by :meth:`Gate.verify` in the gate's own thread (scrypt takes tens of
  milliseconds and 16 MiB: one at a time, off the loop), an unknown user against a dummy hash so
  that the answer's time does not tell which users exist.

A request that is not allowed is not memoised (the engine's memos only ever learn allowed reads:
the same bytes carry the same credentials).
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import hashlib
import hmac
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

__all__ = (
    "ADDRESSES_MAX",
    "ALLOWED",
    "FORGET_AFTER",
    "FREE_FAILURES",
    "LOCK_MAX",
    "MISSING",
    "REALM",
    "SLOW",
    "VERIFIED_MAX",
    "AuthError",
    "Gate",
    "Secret",
    "hash_password",
    "parse_entry",
    "read_auth_file",
)

#: What a Basic challenge names (``WWW-Authenticate: Basic realm="aiosendfile", charset="UTF-8"``).
REALM = "aiosendfile"
#: Authorization values that passed, kept to allow them again without a hash; longer ones are not.
VERIFIED_MAX = 256
VERIFIED_MAX_VALUE = 1024
#: Failures an address may have before it is locked out, and the longest lock.
FREE_FAILURES = 5
LOCK_MAX = 60.0
#: Addresses tracked at most, and how long after its last failure one is forgotten.
ADDRESSES_MAX = 4096
FORGET_AFTER = 900.0
#: scrypt's cost for new hashes: N = 2**14, r = 8, p = 1 (16 MiB, ~50 ms).
LOG_N = 14

#: Gate.check's verdicts besides a lock's seconds (> 0: never one of these).
ALLOWED = 0.0
MISSING = -1.0  # no credentials, or wrong ones checked at once: 401
SLOW = -2.0  # to be checked with Gate.verify, off the loop


class AuthError(ValueError):
    """An ``--auth`` value or an ``--auth-file`` line that cannot be used (the message says why)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def hash_password(password: str, *, salt: bytes | None = None, log_n: int = LOG_N) -> str:
    """A salted scrypt hash of *password*, as ``--auth-file`` takes it."""
    salt = os.urandom(16) if salt is None else salt
    key = hashlib.scrypt(password.encode(), salt=salt, n=1 << log_n, r=8, p=1, dklen=32)
    return f"$scrypt$ln={log_n},r=8,p=1${_b64(salt)}${_b64(key)}"


@dataclass(frozen=True)
class Secret:
    """One user's password: its SHA-256 (given in clear) or its scrypt hash and parameters."""

    digest: bytes = b""  # SHA-256 of the password given in clear
    salt: bytes = b""
    key: bytes = b""
    log_n: int = 0
    r: int = 0
    p: int = 0

    @property
    def slow(self) -> bool:
        return not self.digest

    def matches_now(self, password: bytes) -> bool:
        """(A password given in clear.) Whether *password* is it, in constant time."""
        return hmac.compare_digest(hashlib.sha256(password).digest(), self.digest)

    def matches(self, password: bytes) -> bool:
        """Whether *password* is it (a hash: scrypt, tens of milliseconds; in a thread)."""
        if not self.slow:
            return self.matches_now(password)
        got = hashlib.scrypt(
            password, salt=self.salt, n=1 << self.log_n, r=self.r, p=self.p, dklen=len(self.key), maxmem=2**26
        )
        return hmac.compare_digest(got, self.key)


def _parse_hash(text: str) -> Secret:
    """``$scrypt$ln=14,r=8,p=1$SALT$HASH`` as a :class:`Secret` (AuthError if it is not one)."""
    parts = text.split("$")
    if len(parts) != 5 or parts[0] or parts[1] != "scrypt":
        raise AuthError("a hash is $scrypt$ln=N,r=R,p=P$SALT$HASH (aiosendfile hash-password USER)")
    try:
        params = dict(item.split("=", 1) for item in parts[2].split(","))
        log_n, r, p = int(params["ln"]), int(params["r"]), int(params["p"])
        salt, key = _unb64(parts[3]), _unb64(parts[4])
    except (ValueError, KeyError, binascii.Error):
        raise AuthError("the hash's parameters or base64 cannot be read") from None
    if not (1 <= log_n <= 20 and 1 <= r <= 32 and 1 <= p <= 16 and salt and len(key) >= 16):
        raise AuthError("the hash's parameters are out of range (ln 1-20, r 1-32, p 1-16)")
    if 128 * r * (1 << log_n) > 2**26:
        raise AuthError("the hash needs more than 64 MiB of memory to check")
    return Secret(salt=salt, key=key, log_n=log_n, r=r, p=p)


def parse_entry(text: str, *, hashed_only: bool = False) -> tuple[bytes, Secret]:
    """``USER:PASSWORD`` or ``USER:$scrypt$...`` as (user, secret); AuthError says what is wrong."""
    user, colon, password = text.partition(":")
    if not colon or not user:
        raise AuthError("expected USER:$scrypt$..." if hashed_only else "expected USER:PASSWORD")
    if any(ord(c) < 32 or c == "\x7f" for c in text):
        raise AuthError("a user or password cannot hold control characters")
    if password.startswith("$scrypt$"):
        return user.encode(), _parse_hash(password)
    if hashed_only:
        raise AuthError("expected USER:$scrypt$... (aiosendfile hash-password USER prints one)")
    if not password:
        raise AuthError("the password is empty")
    return user.encode(), Secret(digest=hashlib.sha256(password.encode()).digest())


def read_auth_file(path: str) -> dict[bytes, Secret]:
    """The users of an ``--auth-file``: ``user:hash`` a line; blank lines and ``#`` comments are
    skipped. OSError if it cannot be read; AuthError naming the line that cannot be used."""
    users: dict[bytes, Secret] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                user, secret = parse_entry(line, hashed_only=True)
            except AuthError as exc:
                raise AuthError(f"line {number}: {exc}") from None
            users[user] = secret
    return users


class Gate:
    """Decides requests by their credentials (see the module); one per engine, loop-thread only,
    but :meth:`verify`, which runs in the gate's thread."""

    def __init__(self, users: dict[bytes, Secret], public_read: bool = False) -> None:
        if not users:
            raise ValueError("a gate needs at least one user")
        self.users = users
        self.public_read = public_read
        self.verified: OrderedDict[bytes, None] = OrderedDict()
        self.failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # address → (count, last)
        self._dummy = next((s for s in users.values() if s.slow), None)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def check(self, method: bytes, value: bytes | None, address: str, now: float) -> float:
        """ALLOWED, MISSING (401), SLOW (:meth:`verify` it), or the seconds of a lock (429)."""
        if self.public_read and method in (b"GET", b"HEAD"):
            return ALLOWED
        if value is None:
            return MISSING
        if value in self.verified:
            self.verified.move_to_end(value)
            return ALLOWED
        locked = self.locked_for(address, now)
        if locked:
            return locked
        found = _credentials(value)
        secret = None if found is None else self.users.get(found[0])
        if found is None or (secret is None and self._dummy is None):  # (nothing slow to time)
            self.record(value, False, address, now)
            return MISSING
        if secret is not None and not secret.slow:
            ok = secret.matches_now(found[1])
            self.record(value, ok, address, now)
            return ALLOWED if ok else MISSING
        return SLOW

    def verify(self, value: bytes) -> bool:
        """(In the gate's thread.) Whether *value* holds a user's right password."""
        found = _credentials(value)
        if found is None:
            return False
        secret = self.users.get(found[0])
        if secret is None:
            if self._dummy is not None:
                self._dummy.matches(found[1])  # (the same time as a wrong password)
            return False
        return secret.matches(found[1])

    def submit(self, value: bytes) -> concurrent.futures.Future[bool]:
        """:meth:`verify` in the gate's one thread."""
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aiosendfile-auth")
            return self._pool.submit(self.verify, value)

    def record(self, value: bytes, ok: bool, address: str, now: float) -> None:
        """The outcome of a check: a success is kept and clears the address; a failure counts."""
        failures = self.failures
        if ok:
            failures.pop(address, None)
            if len(value) <= VERIFIED_MAX_VALUE:
                self.verified[value] = None
                self.verified.move_to_end(value)
                while len(self.verified) > VERIFIED_MAX:
                    self.verified.popitem(last=False)
            return
        count, last = failures.pop(address, (0, now))
        failures[address] = (count + 1 if now - last < FORGET_AFTER else 1, now)
        while len(failures) > ADDRESSES_MAX:
            failures.popitem(last=False)

    def locked_for(self, address: str, now: float) -> float:
        """Seconds *address* is still locked out (0.0: it is not)."""
        held = self.failures.get(address)
        if held is None:
            return 0.0
        count, last = held
        if count < FREE_FAILURES:
            return 0.0
        left = last + min(2.0 ** (count - FREE_FAILURES), LOCK_MAX) - now
        return left if left > 0 else 0.0

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None


def _credentials(value: bytes) -> tuple[bytes, bytes] | None:
    """(user, password) of a ``Basic`` value, or None if it is not one."""
    scheme, _, token = value.strip().partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(b":")
    if not colon:
        return None
    return user, password
