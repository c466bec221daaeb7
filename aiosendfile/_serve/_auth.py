"""``serve --auth``: HTTP Basic authentication, decided when each request is answered.

Who may come in: users from ``--auth USER:PASSWORD`` (the password as given, or a hash) and
``--auth-file`` (one ``user:hash`` a line). A hash is scrypt (the standard library's
``hashlib.scrypt``) in the PHC string format ``$scrypt$ln=14,r=8,p=1$SALT$HASH`` (base64, no
padding); :func:`hash_password` makes one (``aiosendfile hash-password USER`` prints the line).

:class:`Gate` decides a request from its ``Authorization`` value and its client's *key* (the
address, an IPv6 one by its /64: :func:`address_key`), at the moment the request is answered,
never when it was parsed (a pipelined guess is judged after the failures before it):

* an address whose credentials failed :data:`FREE_FAILURES` times is locked out for 1 s after
  that failure, twice as long after each further one, up to :data:`LOCK_MAX` seconds: 429 with
  ``Retry-After``, whatever it sends meanwhile, a right password or one that passed before too
  (a lock that let one through would tell it is right). Its count stops growing at
  :data:`COUNT_MAX` and is forgotten :data:`FORGET_AFTER` seconds after its last failure (a
  success does not clear it: one account's password would reset the lock for guesses at
  another's). :data:`ADDRESSES_MAX` addresses are tracked, the least recently failed out
  first. Malformed credentials count as a failure; a request with none does not (a browser's
  first): 401;
* a value that passed before (:data:`VERIFIED_MAX` kept, the least recently used out first) or a
  password given in clear that matches (a SHA-256 of each side compared in constant time):
  allowed;
* anything else is checked by :meth:`Gate.verify_later` in the gate's one thread (scrypt takes
  tens of milliseconds and 16 MiB), an unknown user against a dummy hash so that the answer's
  time does not tell which users exist (beside a hashed user, a user whose password was given in
  clear is checked there too, after the dummy hash: else its quick answer would tell it exists).
  The thread judges the lock again just before it hashes and counts the outcome before it
  takes the next check, so guesses queued together from many connections are each judged after
  the ones before. The queue is bounded: at most
  :data:`QUEUE_PER_ADDRESS` distinct values of one address (429 beyond) and :data:`QUEUE_MAX` in
  all (503 beyond), and a value already queued for an address is not queued twice (a browser's
  parallel connections): a flood of guesses from one client costs that client, and a value that
  passed before is allowed without the queue (guessers spread over many addresses can still
  keep new logins waiting: 503 with ``Retry-After``).

State is per process: with ``serve --workers N`` each worker counts on its own (an address may
then have up to N times FREE_FAILURES free guesses before every worker locks it out).

A request that is not allowed is not memoised (the engine's memos only ever learn allowed reads,
and a remembered read that carried credentials is replayed only while its address is not locked).
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import hashlib
import hmac
import ipaddress
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = (
    "ADDRESSES_MAX",
    "ALLOWED",
    "BUSY",
    "COUNT_MAX",
    "FORGET_AFTER",
    "FREE_FAILURES",
    "LOCK_MAX",
    "MISSING",
    "QUEUE_MAX",
    "QUEUE_PER_ADDRESS",
    "REALM",
    "SLOW",
    "VERIFIED_MAX",
    "AuthError",
    "Gate",
    "Secret",
    "TrustedProxies",
    "address_key",
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
#: An address's count of failures stops growing here: the lock is LOCK_MAX long well before.
COUNT_MAX = FREE_FAILURES + 16
#: Addresses tracked at most, and how long after its last failure one is forgotten.
ADDRESSES_MAX = 4096
FORGET_AFTER = 900.0
#: Checks waiting for (or in) the gate's thread: distinct values of one address, and in all.
QUEUE_PER_ADDRESS = 2
QUEUE_MAX = 64
#: scrypt's cost for new hashes: N = 2**14, r = 8, p = 1 (16 MiB, ~50 ms).
LOG_N = 14

#: Gate.check's verdicts besides a lock's seconds (> 0: never one of these).
ALLOWED = 0.0
MISSING = -1.0  # no credentials, or wrong ones: 401
SLOW = -2.0  # to be checked with Gate.verify_later, off the loop
BUSY = -3.0  # the gate's queue is full: 503, try again in a second


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


def address_key(address: str) -> str:
    """What a client is locked out as: its IPv4 address (an IPv4-mapped IPv6 one too), the /64
    of an IPv6 address (one host commonly holds a whole /64), anything else as it is."""
    if ":" not in address:
        return address
    try:
        ip = ipaddress.IPv6Address(address.split("%", 1)[0])
    except ValueError:
        return address
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Address(ip.packed[:8] + bytes(8))) + "/64"


class TrustedProxies:
    """``--trusted-proxy``: the addresses (or networks) of reverse proxies whose
    ``X-Forwarded-For`` names the client. Only that header: every common proxy appends to it
    (nginx's ``$proxy_add_x_forwarded_for``, Caddy, Traefik, HAProxy's ``forwardfor``), and one
    that does not touch ``Forwarded`` passes on whatever the client wrote there."""

    def __init__(self, specs: tuple[str, ...]) -> None:
        self.networks = tuple(ipaddress.ip_network(spec.strip(), strict=False) for spec in specs)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self.networks)

    def client(self, x_forwarded_for: bytes) -> str | None:
        """The client a trusted proxy names: the last hop that is not itself a trusted proxy
        (the proxy appends the address it saw; what the client sent comes before and is not
        believed past a hop we do not trust). None if there is none to read."""
        hops = [_node(hop.strip()) for hop in x_forwarded_for.decode("latin-1").split(",")]
        for hop in reversed(hops):
            if not hop:
                return None  # ("unknown", an obfuscated name: nothing to key on)
            if not self.trusts(hop):
                return hop
        return None


def _node(text: str) -> str:
    """An address out of a forwarded hop (``2001:db8::1``, ``[2001:db8::1]:4711``,
    ``192.0.2.1:80``), or ""."""
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return ""


class Gate:
    """Decides requests by their credentials (see the module). :meth:`check` and
    :meth:`verify_later` on the loop; the checks it queues run in the gate's one thread; its
    tables are shared between them under one lock."""

    def __init__(
        self,
        users: dict[bytes, Secret],
        public_read: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not users:
            raise ValueError("a gate needs at least one user")
        self.users = users
        self.public_read = public_read
        self.clock = clock
        self.verified: OrderedDict[bytes, None] = OrderedDict()
        self.failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # key → (count, last)
        self._dummy = next((s for s in users.values() if s.slow), None)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._queued: dict[tuple[bytes, str], concurrent.futures.Future[float]] = {}
        self._queued_by: dict[str, int] = {}

    def check(self, method: bytes, value: bytes | None, key: str, now: float) -> float:
        """ALLOWED, MISSING (401), SLOW (:meth:`verify_later` it), or the seconds of a lock (429).
        Judged and counted under the gate's lock: no other check slips in between."""
        if self.public_read and method in (b"GET", b"HEAD"):
            return ALLOWED
        if value is None:
            return MISSING
        with self._lock:
            locked = self._locked_for(key, now)
            if locked:
                return locked
            if value in self.verified:
                self.verified.move_to_end(value)
                return ALLOWED
            found = _credentials(value)
            if found is not None and self._dummy is not None:
                return SLOW  # (a hash; an unknown user, or one in clear, timed as one)
            secret = None if found is None else self.users.get(found[0])
            ok = secret is not None and found is not None and secret.matches_now(found[1])
            self._record(value, ok, key, now)
        return ALLOWED if ok else MISSING

    def judge(self, method: bytes, value: bytes | None, key: str) -> concurrent.futures.Future[float] | float:
        """:meth:`check` now, and a SLOW value queued for the gate's thread
        (:meth:`verify_later`): a verdict, or a future of one."""
        verdict = self.check(method, value, key, self.clock())
        if verdict != SLOW:
            return verdict
        assert value is not None
        return self.verify_later(value, key)

    def verify_later(self, value: bytes, key: str) -> concurrent.futures.Future[float] | float:
        """A SLOW value checked in the gate's thread: a future of its verdict (ALLOWED, MISSING
        or a lock's seconds: the lock is judged again just before the hash), or a verdict now
        when the queue has no room (a lock's 1 s for a key with QUEUE_PER_ADDRESS values queued,
        BUSY when QUEUE_MAX are)."""
        with self._lock:
            job = self._queued.get((value, key))
            if job is not None:
                return job  # (the same value from the same client: one check answers both)
            queued = self._queued_by.get(key, 0)
            if queued >= QUEUE_PER_ADDRESS:
                return 1.0
            if len(self._queued) >= QUEUE_MAX:
                return BUSY
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aiosendfile-auth")
            job = self._pool.submit(self._judge, value, key)
            self._queued[value, key] = job
            self._queued_by[key] = queued + 1
        return job

    def _judge(self, value: bytes, key: str) -> float:
        """(In the gate's thread.) The verdict on *value* from *key*, counted before the next."""
        try:
            with self._lock:
                locked = self._locked_for(key, self.clock())
                if locked:
                    return locked
                if value in self.verified:  # (passed meanwhile, from another connection)
                    return ALLOWED
            ok = self.verify(value)
            with self._lock:  # (the lock again: failures counted meanwhile by other checks)
                now = self.clock()
                locked = self._locked_for(key, now)
                self._record(value, ok, key, now)
            if locked:
                return locked
            return ALLOWED if ok else MISSING
        finally:
            with self._lock:
                self._queued.pop((value, key), None)
                left = self._queued_by.get(key, 1) - 1
                if left > 0:
                    self._queued_by[key] = left
                else:
                    self._queued_by.pop(key, None)

    def verify(self, value: bytes) -> bool:
        """(In the gate's thread.) Whether *value* holds a user's right password."""
        found = _credentials(value)
        if found is None:
            return False
        secret = self.users.get(found[0])
        if secret is None or not secret.slow:
            if self._dummy is not None:  # (the same time as a hashed user's password)
                self._dummy.matches(found[1])
            if secret is None:
                return False
        return secret.matches(found[1])

    def record(self, value: bytes, ok: bool, key: str, now: float) -> None:
        """The outcome of a check: a success is kept (its value, if in its one canonical
        spelling); a failure counts against the key."""
        with self._lock:
            self._record(value, ok, key, now)

    def _record(self, value: bytes, ok: bool, key: str, now: float) -> None:
        failures = self.failures
        if ok:
            # (a success does not clear the key's failures: one account's right password between
            # guesses at another's would reset the lock; they are forgotten FORGET_AFTER on.
            # Only the canonical spelling is kept: variants, "basic", extra spaces, would each
            # take a place and push the others out)
            if len(value) <= VERIFIED_MAX_VALUE and _canonical(value):
                self.verified[value] = None
                self.verified.move_to_end(value)
                while len(self.verified) > VERIFIED_MAX:
                    self.verified.popitem(last=False)
            return
        count, last = failures.pop(key, (0, now))
        count = count + 1 if now - last < FORGET_AFTER else 1
        failures[key] = (min(count, COUNT_MAX), now)
        while len(failures) > ADDRESSES_MAX:
            failures.popitem(last=False)

    def locked_for(self, key: str, now: float) -> float:
        """Seconds *key* is still locked out (0.0: it is not)."""
        with self._lock:
            return self._locked_for(key, now)

    def _locked_for(self, key: str, now: float) -> float:
        held = self.failures.get(key)
        if held is None:
            return 0.0
        count, last = held
        if count < FREE_FAILURES:
            return 0.0
        # (the exponent is capped first: 2.0 ** 1024 raises OverflowError)
        left = last + min(2.0 ** min(count - FREE_FAILURES, 6), LOCK_MAX) - now
        return left if left > 0 else 0.0

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            self._queued.clear()  # (the cancelled checks never reach their own cleanup)
            self._queued_by.clear()


def _canonical(value: bytes) -> bool:
    """Whether *value* is a Basic value as browsers and curl spell it (``Basic`` and one space)."""
    return value.startswith(b"Basic ") and b" " not in value[6:]


def user_of(value: bytes | None) -> str | None:
    """The user name a ``Basic`` *value* gives (the gate checked it), or None."""
    found = None if value is None else _credentials(value)
    return None if found is None else found[0].decode("utf-8", "surrogateescape")


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
