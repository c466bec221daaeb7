"""The parent of ``aiosendfile serve --workers N``: N worker processes that share the port with
``SO_REUSEPORT``, started, restarted after a :class:`Backoff` when one dies (saying so), and
stopped together. Each worker is :func:`._serve_run.worker`."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time
from typing import Any

from ._common import NO_OP_SIGNALS, SERVE_SIGNALS, announce, fail, hangup_text, ignored_text, in_words
from ._serve_run import PROG, quiet_exit, say, signal_name, stderr_lines, worker

__all__ = ("Backoff", "STOP_WORKERS_WITHIN", "Supervisor")

STOP_WORKERS_WITHIN = 5.0  # seconds workers get to stop once told; then they are killed


class Backoff:
    """How long a worker slot waits before it starts a new worker after one died: 0.1 s, doubling
    with each death up to 10 s, so that a worker that dies at once does not make the parent spin;
    back to 0.1 s after a worker that had run :attr:`STABLE` seconds."""

    FIRST = 0.1
    CAP = 10.0
    STABLE = 30.0

    def __init__(self) -> None:
        self.delay = self.FIRST

    def after(self, ran: float) -> float:
        """The wait before the next start, now that a worker that ran *ran* seconds died."""
        if ran >= self.STABLE:
            self.delay = self.FIRST
        delay = self.delay
        self.delay = min(delay * 2, self.CAP)
        return delay


class _Slot:
    """One of the N workers: its process (None between a death and the restart), and when."""

    __slots__ = ("backoff", "error", "listening", "proc", "restart_at", "since")

    def __init__(self) -> None:
        self.proc: Any = None  # a multiprocessing Process
        self.since = 0.0  # when it started (monotonic)
        self.listening = False  # it said it listens
        self.error = ""  # what it said instead (it could not listen, or its server start)
        self.restart_at: float | None = None
        self.backoff = Backoff()


class Supervisor:
    """The parent of ``--workers N``: starts the workers, prints the banner once every one listens,
    restarts one that dies (saying so; with a :class:`Backoff`), stops them all on a stop signal.

    Signals are handled by its own loop: their Python handlers only note them, and
    ``signal.set_wakeup_fd`` wakes the wait on the workers' sentinels, so a stop is acted on at
    once, during a backoff too. Lines go through the log's writer (they never block the parent,
    even when the workers' access log has filled stderr). Workers are forked with the signals
    blocked, take their own handlers (SIGINT/SIGTERM stop gracefully, SIGHUP/SIGUSR1/SIGUSR2 are
    the parent's business: ignored), close the parent's descriptors, then unblock them.
    """

    def __init__(
        self, args: argparse.Namespace, directory: str, host: str, port: int, holder: socket.socket
    ) -> None:
        import multiprocessing

        self.ctx: Any = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
        self.args = args
        self.directory = directory
        self.host = host
        self.port = port
        self.holder = holder  # the socket that holds the port: the parent's, not the workers'
        self.slots = [_Slot() for _ in range(args.workers)]
        self.signals: list[int] = []
        self.stopping = False
        self.kill_at = 0.0  # stopping: workers still running then are killed
        self.started = False  # every worker listened once: the banner is out
        self.start_failed = False

    def run(self, banner: str) -> int:
        hangup = signal.getsignal(signal.SIGHUP) != signal.SIG_IGN  # (nohup: it stays ignored)
        handled = [signum for signum in SERVE_SIGNALS if hangup or signum != signal.SIGHUP]
        self.ready, self.ready_w = self.ctx.Pipe(duplex=False)
        self.wake_r, self.wake_w = os.pipe()
        if sys.stderr is not None:
            stderr_lines().linger = 0.0  # its thread ends once its lines are out: workers are forked
        try:
            os.set_blocking(self.wake_r, False)
            os.set_blocking(self.wake_w, False)
            wakeup = signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
            for signum in handled:
                signal.signal(signum, self._on_signal)
            try:
                for slot in self.slots:
                    self._handle_signals()
                    if self.stopping:
                        break
                    if error := self._start(slot):
                        self._failed_to_start(error)
                        break
                self._supervise(banner)
            finally:
                blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SERVE_SIGNALS)
                try:
                    quiet_exit(worker=False, stopping=True)
                    signal.set_wakeup_fd(wakeup)
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        finally:
            for slot in self.slots:
                if slot.proc is not None:  # (only after an error of ours: they are gone otherwise)
                    slot.proc.kill()
                    slot.proc.join()
                    slot.proc.close()
            self.ready.close()
            self.ready_w.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
        return 1 if self.start_failed else 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)  # acted on by the loop below, which the wakeup fd wakes

    def _supervise(self, banner: str) -> None:
        import multiprocessing.connection

        while True:
            self._handle_signals()
            self._read_ready()
            self._reap()
            live = [slot.proc for slot in self.slots if slot.proc is not None]
            if self.stopping and not live:
                return
            if not (self.started or self.stopping) and all(slot.listening for slot in self.slots):
                announce(banner)  # the banner promises a working server
                self.started = True
            now = time.monotonic()
            if self.stopping:
                deadline: float | None = self.kill_at
                if now >= self.kill_at:
                    for proc in live:
                        say(f"worker {proc.pid} did not stop within {STOP_WORKERS_WITHIN:g} s: killed")
                        proc.kill()
                    self.kill_at = now + 3600.0
            else:
                for slot in self.slots:
                    due_now = slot.restart_at is not None and now >= slot.restart_at
                    if due_now and (error := self._start(slot)):
                        delay = slot.backoff.after(0.0)
                        say(f"cannot start a worker: {error}; trying again in {delay:g} s")
                        slot.restart_at = now + delay
                due = [slot.restart_at for slot in self.slots if slot.restart_at is not None]
                deadline = min(due, default=None)
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            waiting = [self.wake_r, self.ready, *(slot.proc.sentinel for slot in self.slots if slot.proc)]
            multiprocessing.connection.wait(waiting, timeout)
            with contextlib.suppress(OSError):
                while os.read(self.wake_r, 512):
                    pass

    def _handle_signals(self) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            if signum in NO_OP_SIGNALS:
                say(ignored_text(signum))
                continue
            if signum == signal.SIGHUP and not self.stopping:
                say(hangup_text())
            self._stop()  # (again while stopping: each worker gets one more SIGTERM)

    def _read_ready(self) -> None:
        while self.ready.poll():
            pid, error = self.ready.recv()
            for slot in self.slots:
                if slot.proc is not None and slot.proc.pid == pid:
                    slot.listening = not error
                    slot.error = error
                    if error and not (self.started or self.stopping):
                        self._failed_to_start(error)

    def _reap(self) -> None:
        for slot in self.slots:
            proc = slot.proc
            if proc is None or proc.exitcode is None:
                continue
            slot.proc = None
            pid, code = proc.pid, proc.exitcode
            proc.close()
            if self.stopping:
                continue
            if not self.started:
                self._failed_to_start(slot.error or "it exited")
                continue
            now = time.monotonic()
            delay = slot.backoff.after(now - slot.since)
            if slot.error:
                why = f"could not start: {slot.error}"
            elif code < 0:
                why = f"was killed by {signal_name(-code)}"
            else:
                why = f"exited with status {code}"
            say(f"worker {pid} {why}; restarting in {delay:g} s")
            slot.restart_at = now + delay

    def _failed_to_start(self, error: str) -> None:
        if not self.start_failed:
            self.start_failed = True
            fail(PROG, f"a worker failed to start: {error}")
        self._stop()

    def _stop(self) -> None:
        if not self.stopping:
            self.stopping = True
            self.kill_at = time.monotonic() + STOP_WORKERS_WITHIN
        for slot in self.slots:
            slot.restart_at = None
            if slot.proc is not None and slot.proc.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.proc.pid, signal.SIGTERM)

    def _start(self, slot: _Slot) -> str:
        """Start *slot*'s worker; what went wrong, in words ("" if nothing)."""
        inherited: list[int] = []
        if self.ctx.get_start_method() == "fork":  # what the child gets and must not keep
            inherited = [self.wake_r, self.wake_w, self.ready.fileno(), self.holder.fileno()]
            inherited += [other.proc.sentinel for other in self.slots if other.proc is not None]
        proc = self.ctx.Process(
            target=worker,
            args=(self.args, self.directory, self.host, self.port, self.ready_w, inherited),
            daemon=True,
        )
        # Forked with the signals blocked: one that comes before the worker has its own handlers
        # waits for them (the child would otherwise run the parent's). The parent's own, if one
        # came meanwhile, runs once `proc` is in its slot, so a stop reaches it.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SERVE_SIGNALS)
        try:
            proc.start()
        except OSError as exc:  # no memory, no more processes
            return in_words(exc)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        slot.proc = proc
        slot.since = time.monotonic()
        slot.listening = False
        slot.error = ""
        slot.restart_at = None
        return ""
