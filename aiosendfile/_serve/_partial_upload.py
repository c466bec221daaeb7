"""Resumable uploads, one request's part (a creation, with or without a body, or an append) and
the answers the store's state gives: :class:`ResumableUpload` lands a body in an upload's partial
file (``_partial``) as ``_upload.Upload`` lands a ``PUT`` body in its temporary file, and gives
the file its name when the upload is complete.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from .._static._answer import Answer
from ._partial import (
    CREATED_MAX,
    Landing,
    Limits,
    RecordTooLarge,
    Store,
    lifetime,
    lock,
    partial_name,
    still_named,
)
from ._resumable import (
    CREATE,
    TUS_EXTENSIONS,
    TUS_RESUMABLE,
    TUS_VERSIONS,
    Ask,
    expires_field,
    id_of,
    interim,
    limit_field,
)
from ._upload import Target, Upload, UploadRefused, open_directory, status_of

__all__ = ("ResumableUpload", "options_answer", "status_answer")


class ResumableUpload(Upload):
    """One request's part of a resumable upload: a creation (with or without a body) or an
    append. It lands as a :class:`~._upload.Upload` does (``write``, or splice at ``written``), but
    into the partial file, and an :meth:`abort` keeps what was written: the client resumes there.
    Pool-thread calls, in order: :meth:`open`, :meth:`write`..., then :meth:`commit` or
    :meth:`abort`."""

    def __init__(
        self,
        store: Store,
        ask: Ask,
        target: Target,
        path: str,
        token: bytes,
        user: str | None,
        owner: str,
        location: str,
        body_length: int | None,
    ) -> None:
        super().__init__(target, store.policy, store.overwrite)
        self.store = store
        self.ask = ask
        self.path = path  # relative to the root: what the record says
        self.id = id_of(token)
        self.user = user
        self.owner = owner
        self.location = location
        self.body_length = body_length
        self.start = 0
        self.length: int | None = None  # the whole upload's, once known
        self.record: dict[str, Any] | None = None
        self.replay: Answer | None = None  # (tus) an append to a completed upload: its final answer again
        self.locked = False
        self.room = store.limits.owner_bytes  # the bytes it may hold: its owner's share, less the others'

    # -- the fields of its answers -----------------------------------------------------------------

    def _expires(self) -> float:
        record = self.record or {}
        return float(record.get("touched", time.time())) + lifetime(record, self.store.limits.expiry)

    def _limit(self) -> tuple[str, str]:
        return limit_field(self.store.limits.max_size, self._expires() - time.time())

    def fields(self, offset: int | None, complete: bool | None) -> list[tuple[str, str]]:
        """The fields of an answer to this request (*offset*: the upload's, if it is to be told)."""
        fields: list[tuple[str, str]] = []
        if self.ask.tus:
            fields.append(TUS_RESUMABLE)
            if offset is not None:
                fields.append(("Upload-Offset", str(offset)))
            if complete is False:
                fields.append(expires_field(self._expires()))
        else:
            if complete is not None:
                fields.append(("Upload-Complete", "?1" if complete else "?0"))
            if offset is not None:
                fields.append(("Upload-Offset", str(offset)))
            if complete is False:
                fields.append(self._limit())
        return fields

    def refused(
        self, status: int, why: str = "", offset: int | None = None, complete: bool | None = False
    ) -> UploadRefused:
        exc = UploadRefused(status, why)
        exc.extra = tuple(self.fields(offset, complete))
        return exc

    def interim(self) -> bytes | None:
        """The 104 a creation sends once its upload exists (IETF, a client of this interop
        version, HTTP/1.1: the caller checks that), else None."""
        if self.ask.step == CREATE and not self.ask.tus and self.ask.interop:
            return interim(self.location, self._limit())
        return None

    # -- the pool's steps ------------------------------------------------------------------------------

    def open(self) -> None:
        try:
            if self.ask.step == CREATE:
                self._create()
            else:
                self._resume()
        except UploadRefused as exc:
            self.abort()
            if not exc.extra and self.ask.tus:
                exc.extra = tuple(self.fields(None, None))  # (every tus answer says its version)
            raise
        except BaseException:
            self.abort()
            raise

    def _announced(self, offset: int) -> int | None:
        """The whole upload's length as this request tells it (UploadRefused 400 where its fields
        disagree with each other or with the record)."""
        ask = self.ask
        lengths = set()
        if ask.length is not None:
            lengths.add(ask.length)
        if ask.complete and self.body_length is not None:
            lengths.add(offset + self.body_length)
        known = None if self.record is None else self.record.get("length")
        if known is not None:
            lengths.add(int(known))
        if len(lengths) > 1:
            raise self.refused(400, "inconsistent upload length", offset)
        length = lengths.pop() if lengths else None
        reach = offset + (self.body_length or 0)
        if length is not None and length < reach:
            raise self.refused(400, "inconsistent upload length", offset)
        largest = self.store.limits.max_size
        if largest is not None and (reach if length is None else length) > largest:
            raise self.refused(413, "larger than the server takes", offset)
        # The owner's share: judged for a length told now, or for the bytes a request of no known
        # length adds; a length the record holds was judged when it was told.
        needed = reach if length is None else None if known is not None else length
        if needed is not None and needed > offset and needed > self.room:
            raise self.refused(507, "too many bytes in uploads in progress for this client", offset)
        return length

    def _create(self) -> None:
        self.dir_fd = open_directory(self.target.parent, self.policy)
        self._may_take_name()
        now = time.time()
        # Judged and noted as one step across the workers, as an append's: the room left by the
        # owner's other uploads (a length they told, what they hold or a request under way may
        # bring them to), and this one's share of it held from now on, while its body comes.
        with self.store.registry(exclusive=True, make=True) as reg:
            self.store.make_room(reg, self.owner, None, now)
            self.room = self.store.room(reg, self.owner, self.id)
            self.length = self._announced(0)
            record = {
                "v": 1,
                "path": self.path,
                "length": self.length,
                "user": self.user,
                "owner": self.owner,
                "tus": self.ask.tus,
                "metadata": (self.ask.metadata or b"").decode("latin-1"),
                "dev": None,  # (until its partial file is made: a crash between leaves no orphan)
                "ino": None,
                "size": 0,
                "created": now,
                "touched": now,
                "done": None,
            }
            if self.length is None:  # what it may take, counted against its owner meanwhile
                record["reserved"] = self.body_length if self.body_length is not None else self.room
            name = partial_name(self.id)
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                self.store.save(reg, self.id, record, CREATED_MAX)
                self.fd = os.open(name, flags, 0o644, dir_fd=self.dir_fd)
                self.temp = name
                lock(self.fd)
                self.locked = True
                st = os.fstat(self.fd)
                record.update(dev=st.st_dev, ino=st.st_ino)
                self.store.save(reg, self.id, record)
            except RecordTooLarge:  # (nothing written: its metadata, the one part a client sizes)
                raise self.refused(431, "Upload-Metadata too large to keep") from None
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.unlink(self.id + ".json", dir_fd=reg)
                raise self.refused(status_of(exc)) from None
            self.record = record

    def _resume(self) -> None:
        store = self.store
        with store.registry() as reg:
            self.record = record = store._mine(reg, self.id, self.path, self.user)
        if record.get("done") is not None:
            self._completed(record)
            return
        try:
            self.dir_fd, self.fd = store._open_partial(self.id, record)
        except UploadRefused:
            raise Landing() from None  # (being given its name: asked again, complete; or gone: 404)
        self.temp = partial_name(self.id)  # (named so: given its name by a link when complete)
        lock(self.fd)
        self.locked = True
        offset = os.fstat(self.fd).st_size
        try:
            # Judged and noted as one step across the workers: two requests telling lengths, or
            # a creation, cannot both take the same room.
            with store.registry(exclusive=True) as reg:
                # The record read again, under the lock: another worker may have removed the
                # upload (a DELETE, its expiry) or completed it since it was read, the lock free.
                now = store.load(reg, self.id)
                if now is None:
                    raise UploadRefused(404)
                if now.get("done") is not None:
                    self.record = now
                    self._release()
                    self._completed(now)
                    return
                if not still_named(self.dir_fd, partial_name(self.id), self.fd):
                    # Given its name as we took its lock (the request that completed it lets the
                    # lock go before its record says so): it is the landed file now, never ours
                    # to write. Asked again, the record says complete.
                    self.record = self.temp = None  # (nothing of it is this request's to undo)
                    raise Landing()
                self.record = record = now
                if self.ask.offset != offset:
                    raise self.refused(409, "mismatching upload offset", offset)
                self.room = store.room(reg, str(record.get("owner")), self.id)
                self.length = self._announced(offset)
                if self.length is not None and record.get("length") is None:  # told now: kept, even if cut
                    record["length"] = self.length
                    store.save(reg, self.id, record)
                elif self.length is None:  # what it may take, counted against its owner meanwhile
                    reach = offset + self.body_length if self.body_length is not None else self.room
                    record["reserved"] = max(offset, reach)
                    store.save(reg, self.id, record)
        except UploadRefused:
            if self.fd >= 0:
                os.fdatasync(self.fd)  # (the offset it tells is never one a crash takes back)
            raise
        self.start = self.written = offset

    def _completed(self, record: dict[str, Any]) -> None:
        """An append to an upload already complete changes nothing. tus (as tusd): at its length
        with no content, the final answer again (the completing request's answer was lost), else
        409 with its offset. The IETF draft (interop 8): with content (or of unknown length), an
        inconsistent length, 400; with none, 410 with the completed upload's ``Location``."""
        length = int(record["length"])
        if self.ask.tus:
            if self.ask.offset == length and not self.body_length:
                self.length = length
                self.start = self.written = length
                self.replay = self.final(bool(record["done"] == 201))
                return
            raise self.refused(409, "the upload is complete", length, complete=True)
        if self.body_length != 0:
            raise self.refused(400, "inconsistent upload length: the upload is complete", None, complete=True)
        exc = self.refused(410, "the upload is complete", None, complete=True)
        exc.extra = (("Location", self.location.partition("?")[0]), *exc.extra)
        raise exc

    def write(self, data: bytes | memoryview) -> None:
        end = self.written + len(data)
        if self.replay is not None or (self.length is not None and end > self.length):
            raise self.refused(400, "inconsistent upload length", self.written)
        if self.store.limits.max_size is not None and end > self.store.limits.max_size:
            raise self.refused(413, "larger than the server takes", self.written)
        if self.length is None and end > self.room:
            raise self.refused(507, "too many bytes in uploads in progress for this client", self.written)
        super().write(data)

    def commit(self, size: int) -> Answer:  # type: ignore[override]
        """This request's body is all there (*size* bytes): the upload is complete (flushed, given
        its name) if the request says so (IETF ``Upload-Complete: ?1``; tus: its length reached),
        else its record is brought up to date. The answer."""
        if self.replay is not None:
            return self.replay
        offset = self.written
        if os.fstat(self.fd).st_size != offset or offset != self.start + size:
            raise self.refused(400, "the body is not the length announced", os.fstat(self.fd).st_size)
        length = self.length
        if self.ask.tus:
            if length is None and self.ask.length is not None:
                length = self.length = self.ask.length  # (a deferred length, told now)
            complete = length is not None and offset == length
        else:
            complete = bool(self.ask.complete)
            if complete and length is not None and offset != length:
                raise self.refused(400, "inconsistent upload length", offset)
        record = self.record
        assert record is not None
        if not complete:
            os.fdatasync(self.fd)  # (the offset told is never one a crash takes back)
            record.pop("reserved", None)
            record.update(length=length, size=offset, touched=time.time())
            self.store.note(self.id, record)
            self._release()
            if self.ask.step == CREATE:
                return Answer(201, [("Location", self.location), *self.fields(offset, False)], 0, body=b"")
            return Answer(204, self.fields(offset, False), None)
        try:
            new = self._land(offset)
        except UploadRefused as exc:  # (the name is taken now...): the upload is over
            with self.store.registry() as reg:
                self.store.forget(reg, self.id, record)
            self.abort()
            raise self.refused(exc.status, "", None, complete=True) from None
        finally:
            self._release()
        record.pop("reserved", None)
        record.update(length=offset, size=offset, touched=time.time(), done=201 if new else 204)
        self.store.note(self.id, record)
        return self.final(new)

    def _land(self, size: int) -> bool:
        """Flush the partial file and give it its name (``Upload.commit``'s rules)."""
        return Upload.commit(self, size)

    def final(self, new: bool) -> Answer:
        """The answer of the request that completes the upload: IETF, the one a ``PUT`` gets (201
        for a new file, 204 for one replaced); tus, 201 to a creation, 204 to an append."""
        if self.ask.tus:
            fields = self.fields(self.length, None)
            if self.ask.step == CREATE:
                return Answer(201, [("Location", self.location), *fields], 0, body=b"")
            return Answer(204, fields, None)
        fields = self.fields(None, True)
        return Answer(201, fields, 0, body=b"") if new else Answer(204, fields, None)

    def abort(self) -> None:
        """This request is over without completing the upload: what was written stays (the client
        resumes at its end), unless the upload was being created and has no record."""
        record = self.record
        if record is None and self.temp is not None and self.dir_fd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.temp, dir_fd=self.dir_fd)
        elif record is not None and self.fd >= 0 and record.get("done") is None:
            moved = self.written > self.start
            if moved or "reserved" in record:
                record.pop("reserved", None)
                if moved:
                    record.update(size=self.written, touched=time.time())  # (progress, even cut short)
                self.store.note(self.id, record)
        self._release()

    def _release(self) -> None:
        self.temp = None
        self.locked = False
        self._close()  # (the lock goes with the descriptor)

    def answer(self, result: Answer) -> Answer:  # type: ignore[override]
        return result


def status_answer(ask: Ask, record: dict[str, Any], offset: int, limits: Limits) -> Answer:
    """The answer to a ``HEAD`` of an upload resource: where it stands (never cached)."""
    done = record.get("done") is not None
    length = record.get("length")
    expires = float(record.get("touched", 0)) + lifetime(record, limits.expiry)
    fields: list[tuple[str, str]] = []
    if ask.tus:
        fields += [TUS_RESUMABLE, ("Upload-Offset", str(offset))]
        fields.append(("Upload-Length", str(length)) if length is not None else ("Upload-Defer-Length", "1"))
        if record.get("metadata"):
            fields.append(("Upload-Metadata", record["metadata"]))
        if not done:
            fields.append(expires_field(expires))
        status = 200
    else:
        fields += [("Upload-Offset", str(offset)), ("Upload-Complete", "?1" if done else "?0")]
        if length is not None:
            fields.append(("Upload-Length", str(length)))
        fields.append(limit_field(limits.max_size, None if done else expires - time.time()))
        status = 204
    fields.append(("Cache-Control", "no-store"))
    return Answer(status, fields, None, head_only=True)


def options_answer(limits: Limits) -> Answer:
    """The answer to ``OPTIONS`` under ``--upload``: the methods, what tus and the IETF draft
    take here."""
    fields = [
        ("Allow", "GET, HEAD, OPTIONS, PUT, POST, PATCH, DELETE"),
        TUS_RESUMABLE,
        TUS_VERSIONS,
        ("Tus-Extension", TUS_EXTENSIONS),
        # What PATCH takes (RFC 5789): the IETF draft's appends (its OPTIONS MUST say so), tus's.
        ("Accept-Patch", "application/partial-upload, application/offset+octet-stream"),
    ]
    if limits.max_size is not None:
        fields.append(("Tus-Max-Size", str(limits.max_size)))
    fields.append(limit_field(limits.max_size))
    return Answer(204, fields, None)
