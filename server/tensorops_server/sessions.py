"""The store of quantized inner-product sessions.

- Ids are 128-bit random tokens (secrets.token_urlsafe): they cannot be guessed.
- A session idle for longer than the TTL expires.
- A session belongs to the identity that created it (see auth.py). Another caller
  cannot use, describe, list or release it: to them it does not exist (NOT_FOUND).
- The store keeps at most `max_sessions` sessions holding at most `max_bytes` together,
  and each owner at most `max_sessions_per_owner` holding `max_bytes_per_owner`. Making
  room evicts the owner's own least recently used sessions, never another owner's: when
  the store is full of other owners' sessions, a new one is refused (RESOURCE_EXHAUSTED)
  until some expire or are released.
- Any number of calls may use a session at once (the native context is reentrant). A
  session that expires or is evicted or released while calls use it leaves the store at
  once and is closed when the last of those calls finishes.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from . import errors


@dataclass(eq=False)
class Session:
    id: str
    owner: str
    context: Any  # tensorops_native.QuantizedInnerProduct
    nbytes: int
    shape: tuple[int, int]  # (n, k)
    created: float
    last_used: float
    forward_count: int = 0
    users: int = 0
    retired: bool = False
    queue: Any = None  # forwards waiting to be batched (batching.SessionQueue)


class SessionStore:
    def __init__(
        self,
        *,
        max_sessions: int,
        max_bytes: int,
        ttl: float,
        max_sessions_per_owner: int | None = None,
        max_bytes_per_owner: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_evict: Callable[[str], None] | None = None,
    ):
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.max_sessions_per_owner = max_sessions_per_owner or max_sessions
        self.max_bytes_per_owner = max_bytes_per_owner or max_bytes
        self.ttl = ttl
        self._clock = clock
        self._on_evict = on_evict or (lambda reason: None)
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # least recently used first
        self._bytes = 0

    # ---- queries
    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def snapshot(self, owner: str | None = None) -> list[Session]:
        """The sessions (of `owner`, if given), least recently used first."""
        self.sweep()
        with self._lock:
            return [s for s in self._sessions.values() if owner is None or s.owner == owner]

    # ---- changes
    def add(self, context, nbytes: int, shape: tuple[int, int], owner: str = "anonymous") -> Session:
        nbytes = max(int(nbytes), 1)
        limit = min(self.max_bytes, self.max_bytes_per_owner)
        if nbytes > limit:
            context.close()
            raise errors.exhausted(
                f"the session needs {nbytes} bytes, more than the {limit} bytes the sessions of one caller may hold",
                field="b",
            )
        now = self._clock()
        session = Session(secrets.token_urlsafe(16), owner, context, nbytes, shape, now, now)
        closing = []
        with self._lock:
            closing += self._expire_locked(now)
            own = [s for s in self._sessions.values() if s.owner == owner]  # least recently used first
            own_bytes = sum(s.nbytes for s in own)
            while own and (
                len(self._sessions) >= self.max_sessions
                or self._bytes + nbytes > self.max_bytes
                or len(own) >= self.max_sessions_per_owner
                or own_bytes + nbytes > self.max_bytes_per_owner
            ):
                victim = own.pop(0)
                own_bytes -= victim.nbytes
                del self._sessions[victim.id]
                closing += self._retire_locked(victim, "capacity")
            full = len(self._sessions) >= self.max_sessions or self._bytes + nbytes > self.max_bytes
            if not full:
                self._sessions[session.id] = session
                self._bytes += nbytes
        self._close(closing)
        if full:
            context.close()
            raise errors.exhausted(
                "the server holds as many sessions as it may, all of other callers; try again when some have expired"
            )
        return session

    @contextmanager
    def use(self, session_id: str, owner: str = "anonymous", *, forward: bool = False):
        """The session, marked as used now; NOT_FOUND if it does not exist (any more) or
        belongs to another owner."""
        now = self._clock()
        closing = []
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.owner != owner:
                session = None
            if session is not None and now - session.last_used > self.ttl:
                del self._sessions[session_id]
                closing += self._retire_locked(session, "ttl")
                session = None
            if session is None:
                missing = True
            else:
                missing = False
                self._sessions.move_to_end(session_id)
                session.last_used = now
                session.users += 1
                if forward:
                    session.forward_count += 1
        self._close(closing)
        if missing:
            raise errors.not_found(
                "no such quantized inner-product session (it expired, was evicted or released, or the server restarted)"
            )
        try:
            yield session
        finally:
            with self._lock:
                session.users -= 1
                last = session.retired and session.users == 0
            if last:
                session.context.close()

    def release(self, session_id: str, owner: str = "anonymous") -> None:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.owner != owner:
                session = None
            if session is not None:
                del self._sessions[session_id]
            closing = self._retire_locked(session, None) if session is not None else []
        self._close(closing)
        if session is None:
            raise errors.not_found("no such quantized inner-product session")

    def sweep(self) -> int:
        """Expire idle sessions now; returns how many."""
        with self._lock:
            closing = self._expire_locked(self._clock())
        self._close(closing)
        return len(closing)

    def close_all(self) -> None:
        with self._lock:
            closing = []
            while self._sessions:
                closing += self._retire_locked(self._sessions.popitem(last=False)[1], None)
        self._close(closing)

    # ---- internals (called with the lock held)
    def _expire_locked(self, now: float) -> list[Session]:
        closing = []
        while self._sessions:
            session = next(iter(self._sessions.values()))
            if now - session.last_used <= self.ttl:
                break  # ordered by last use: the rest are younger
            del self._sessions[session.id]
            closing += self._retire_locked(session, "ttl")
        return closing

    def _retire_locked(self, session: Session, reason: str | None) -> list[Session]:
        session.retired = True
        self._bytes -= session.nbytes
        if reason is not None:
            self._on_evict(reason)
        return [session] if session.users == 0 else []

    @staticmethod
    def _close(sessions: list[Session]) -> None:
        for session in sessions:
            session.context.close()


class Sweeper(threading.Thread):
    """Expires idle sessions in the background, so their memory goes back without traffic."""

    def __init__(self, store: SessionStore, interval: float):
        super().__init__(name="tensorops-session-sweeper", daemon=True)
        self._store = store
        self._interval = interval
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self._interval):
            self._store.sweep()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join()
