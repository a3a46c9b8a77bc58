"""Per-device ordering: the operations of one UsbGpu run one at a time, in the order they were issued, from any
thread. Synchronous operations run in the calling thread once their turn comes; asynchronous copies run on one
worker thread per device (started on demand, gone when idle) and report through a CopyHandle.

A ticket is taken when an operation is issued and served in ticket order. A thread interrupted while waiting for
its turn (Ctrl-C) gives its ticket up, so the operations behind it still run.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from speck.usbgpu.errors import CopyWaitTimeout, UsbGpuUsageError

T = TypeVar("T")


class CopyHandle:
    """An asynchronous copy: `wait()` for it (raises what the copy raised), `done()` to poll it.

    `bytes_done` follows the copy as it runs (what its progress callback was last told); `nbytes` is the total.
    """

    def __init__(self, kind: str, nbytes: int) -> None:
        self.kind = kind
        self.nbytes = nbytes
        self.bytes_done = 0
        self.cancel_requested = False
        self._finished = threading.Event()
        self._error: BaseException | None = None

    def done(self) -> bool:
        """Whether the copy has finished (successfully or not)."""
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the copy finished; raise its exception if it failed. TimeoutError if `timeout` seconds pass
        first (the copy keeps running). Ctrl-C here interrupts only the wait: the copy keeps running until it ends
        or its UsbGpu is closed."""
        if not self._finished.wait(timeout):
            raise CopyWaitTimeout(
                f"{self.kind} of {self.nbytes} bytes still running after {timeout} s ({self.bytes_done} bytes done)"
            )
        if self._error is not None:
            raise self._error

    def _settle(self, error: BaseException | None) -> None:
        self._error = error
        self._finished.set()

    def __repr__(self) -> str:
        state = "failed" if self._error else "done" if self.done() else "running"
        return f"<CopyHandle {self.kind} {self.bytes_done}/{self.nbytes} bytes {state}>"


class OpQueue:
    """Ticket-ordered execution for one device (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._cv = threading.Condition()
        self._issued = 0  # the next ticket
        self._serving = 0  # the ticket whose operation may run now
        self._abandoned: set[int] = set()
        self._held: dict[int, int] = {}  # thread -> the ticket it holds (recorded before the ticket is issued)
        self._jobs: deque[tuple[int, Callable[[CopyHandle], None], CopyHandle]] = deque()
        self._worker: threading.Thread | None = None
        self._running_in: int | None = None  # thread running the current operation
        self._current: CopyHandle | None = None  # the asynchronous copy the worker is running

    def in_operation(self) -> bool:
        """Whether the calling thread is inside an operation of this queue (e.g. in a progress callback)."""
        return self._running_in == threading.get_ident()

    def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` in this thread after every operation issued before it, and before any issued after it."""
        if self.in_operation():
            raise UsbGpuUsageError(
                f"{self.name}: a synchronous operation was issued from inside another one (a progress callback?); "
                "it would wait for itself - issue it after the running operation returns"
            )
        me = threading.get_ident()
        try:
            with self._cv:
                self._held[me] = self._issued  # recorded first: an interruption after this line is cleaned up
                self._issued += 1
            self._wait_turn(self._held[me])
            self._running_in = me
            return fn()
        finally:
            self._release(me)

    def submit(self, fn: Callable[[CopyHandle], None], handle: CopyHandle) -> CopyHandle:
        """Queue `fn(handle)` for the worker thread; its outcome settles `handle`."""
        with self._cv:
            self._jobs.append((self._issued, fn, handle))
            self._issued += 1
            if self._worker is None:
                # Not a daemon: interpreter exit waits for queued copies instead of freeing libusb under them.
                self._worker = threading.Thread(target=self._work, name=f"{self.name} copies")
                self._worker.start()
        return handle

    def cancel_queued(self) -> None:
        """Ask every queued or running asynchronous copy to stop (each checks at its next progress point)."""
        with self._cv:
            for _, _, handle in self._jobs:
                handle.cancel_requested = True
            if self._current is not None:
                self._current.cancel_requested = True

    def _work(self) -> None:
        me = threading.get_ident()
        while True:
            with self._cv:
                if not self._jobs:
                    self._worker = None
                    return
                ticket, fn, handle = self._jobs.popleft()
                self._held[me] = ticket
                self._current = handle
            error: BaseException | None = None
            try:
                self._wait_turn(ticket)
                self._running_in = me
                fn(handle)
            except BaseException as exc:  # settled into the handle, raised by its wait()
                error = exc
            finally:
                with self._cv:
                    self._current = None
                self._release(me)
                handle._settle(error)

    def _wait_turn(self, ticket: int) -> None:
        with self._cv:
            while self._serving != ticket:
                self._cv.wait()

    def _release(self, me: int) -> None:
        """The thread is done with its ticket, however it left: pass the turn on if it had it, else give it up."""
        with self._cv:
            if self._running_in == me:
                self._running_in = None
            ticket = self._held.pop(me, None)
            if ticket is None or ticket >= self._issued:
                return  # interrupted before its ticket was issued
            if ticket == self._serving:
                self._serving += 1
            else:
                self._abandoned.add(ticket)
            self._skip_abandoned()
            self._cv.notify_all()

    def _skip_abandoned(self) -> None:
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1
