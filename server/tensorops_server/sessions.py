"""The store of quantized inner-product sessions, shared by every worker process of the
server through its state directory (statedir.py): a session created through one worker is
forwarded, described, listed and released through any other, and its packed B is stored
once, in a file every worker that uses it maps.

- Ids are 128-bit random tokens (secrets.token_urlsafe): they cannot be guessed.
- A session idle for longer than the TTL expires.
- A session belongs to the identity that created it (see auth.py). Another caller
  cannot use, describe, list or release it: to them it does not exist (NOT_FOUND).
- The server keeps at most `max_sessions` sessions holding at most `max_bytes` together,
  and each owner at most `max_sessions_per_owner` holding `max_bytes_per_owner`, whatever
  worker holds them. Making room evicts the owner's own least recently used sessions, never
  another owner's: when the server is full of other owners' sessions, a new one is refused
  (RESOURCE_EXHAUSTED) until some expire or are released.
- Any number of calls may use a session at once, on any worker (the native context is
  reentrant). What happens when workers race on one session: every change of the shared
  state is one SQLite transaction, so of two releases one succeeds and the other gets
  NOT_FOUND; a forward that found the session before a release, eviction or expiry on
  another worker completes with its weights, and a forward that starts after it gets
  NOT_FOUND. A session gone from the store is unmapped by each worker when its last call
  there ends (at the latest at the worker's next sweep), and its memory then returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from . import errors
from .logs import LOGGER
from .statedir import CREATING_FILE, SESSION_FILE, SESSION_USAGE, Connections, StateDir, transaction, usage

log = logging.getLogger(LOGGER)

_MISSING = "no such quantized inner-product session (it expired, was evicted or released, or the server restarted)"
_COLUMNS = "id, owner, nbytes, n, k, max_m, info, created, last_used, forwards"


@dataclass(eq=False)
class Session:
    id: str
    owner: str
    nbytes: int  # the session's memory: its parameters and packed B
    shape: tuple[int, int]  # (n, k)
    max_m: int
    info: str  # the implementation the context runs
    created: float
    last_used: float
    forward_count: int = 0
    context: Any = None  # this worker's tensorops_native.QuantizedInnerProduct over `memory`
    memory: Any = None  # this worker's mapping of the session's memory
    users: int = 0  # this worker's calls using it now
    retired: bool = False  # gone from the store; closed when the last of those calls ends
    queue: Any = None  # forwards waiting to be batched (batching.SessionQueue)

    @classmethod
    def from_row(cls, row) -> Session:
        sid, owner, nbytes, n, k, max_m, info, created, last_used, forwards = row
        return cls(sid, owner, nbytes, (n, k), max_m, info, created, last_used, forwards)

    def close(self) -> None:
        if self.context is not None:
            self.context.close()
        if self.memory is not None:
            with contextlib.suppress(BufferError):  # still exported: unmapped when its last view goes
                self.memory.close()


class SessionStore:
    """The sessions of the server. `attach(memory, max_m)` makes this worker's context over
    the memory another worker's context packed (QuantizedInnerProduct.attach)."""

    def __init__(
        self,
        state: StateDir,
        *,
        max_sessions: int,
        max_bytes: int,
        ttl: float,
        attach: Callable[[Any, int], Any],
        max_sessions_per_owner: int | None = None,
        max_bytes_per_owner: int | None = None,
        clock: Callable[[], float] = time.monotonic,  # CLOCK_MONOTONIC: one clock for every process
        on_evict: Callable[[str], None] | None = None,
    ):
        self.state = state
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.max_sessions_per_owner = max_sessions_per_owner or max_sessions
        self.max_bytes_per_owner = max_bytes_per_owner or max_bytes
        self.ttl = ttl
        self._attach = attach
        self._clock = clock
        self._on_evict = on_evict or (lambda reason: None)
        self._db = Connections(state)
        self._lock = threading.Lock()
        self._local: dict[str, Session] = {}  # the sessions this worker has mapped
        self._made_since_trim = False  # a session was made: the next sweep returns freed memory

    # ---- queries
    def __len__(self) -> int:
        return self.usage()["sessions"]

    @property
    def nbytes(self) -> int:
        return self.usage()["session_bytes"]

    def usage(self) -> dict[str, Any]:
        """What the server's sessions (and regions) hold (statedir.usage)."""
        return usage(self._db.get())

    def alive(self, session_id: str, owner: str) -> bool:
        """Whether the session exists and has not expired (a read: nothing changes)."""
        row = (
            self._db.get()
            .execute(
                "select 1 from sessions where id = ? and owner = ? and last_used >= ?",
                (session_id, owner, self._clock() - self.ttl),
            )
            .fetchone()
        )
        return row is not None

    def snapshot(self, owner: str | None = None) -> list[Session]:
        """The sessions (of `owner`, if given), least recently used first."""
        self.sweep()
        db = self._db.get()
        if owner is None:
            rows = db.execute(f"select {_COLUMNS} from sessions order by last_used").fetchall()
        else:
            rows = db.execute(
                f"select {_COLUMNS} from sessions where owner = ? order by last_used", (owner,)
            ).fetchall()
        return [Session.from_row(row) for row in rows]

    # ---- changes
    def create(self, make: Callable[[Callable[[int], Any]], Any], owner: str = "anonymous") -> Session:
        """A new session. `make(allocate)` builds its context, calling `allocate(nbytes)` once
        for the memory the context packs B into; the cap on one caller's bytes is checked
        there, before any memory is taken, and the server's caps (evicting the owner's least
        recently used sessions) when the context is made."""
        session_id = secrets.token_urlsafe(16)
        creating = self.state.file(f"{CREATING_FILE}{os.getpid()}-{session_id}")
        taken: list[mmap.mmap] = []

        def allocate(nbytes: int) -> mmap.mmap:
            limit = min(self.max_bytes, self.max_bytes_per_owner)
            if nbytes > limit:
                raise errors.exhausted(
                    f"the session needs {nbytes} bytes, more than the {limit} bytes the sessions of one caller may "
                    "hold",
                    field="b",
                )
            taken.append(_new_memory(creating, nbytes))
            return taken[-1]

        try:
            context = make(allocate)
        except BaseException:
            _discard(creating, taken)
            raise
        if not taken:
            context.close()
            raise RuntimeError("the session's context did not take its memory from the store")
        memory = taken[0]
        now = self._clock()
        session = Session(
            session_id,
            owner,
            len(memory),
            (int(context.n), int(context.k)),
            int(getattr(context, "max_m", 1)),
            str(context.info),
            now,
            now,
            context=context,
            memory=memory,
        )
        try:
            evicted, full = self._insert(session, creating)
        except BaseException:
            session.close()
            _discard(creating, [])
            raise
        self._forget(evicted)
        if full:
            session.close()
            _discard(creating, [])
            raise errors.exhausted(
                "the server holds as many sessions as it may, all of other callers; try again when some have expired"
            )
        with self._lock:
            self._local[session.id] = session
        self._made_since_trim = True
        return session

    def _insert(self, session: Session, creating: str) -> tuple[list[tuple[str, str]], bool]:
        """Make room (expired sessions, then the owner's least recently used) and add the
        session, in one transaction; (sessions removed with the reason, whether the server
        was still full of other owners' sessions)."""
        db = self._db.get()
        now = session.created
        evicted: list[tuple[str, str]] = []
        with transaction(db):
            evicted += [
                (sid, "ttl")
                for (sid,) in db.execute("delete from sessions where last_used < ? returning id", (now - self.ttl,))
            ]
            count, total = db.execute(SESSION_USAGE).fetchone()
            own = db.execute(
                "select id, nbytes from sessions where owner = ? order by last_used", (session.owner,)
            ).fetchall()
            own_bytes = sum(nbytes for _, nbytes in own)
            nbytes = session.nbytes
            while own and (
                count >= self.max_sessions
                or total + nbytes > self.max_bytes
                or len(own) >= self.max_sessions_per_owner
                or own_bytes + nbytes > self.max_bytes_per_owner
            ):
                victim, victim_bytes = own.pop(0)
                db.execute("delete from sessions where id = ?", (victim,))
                evicted.append((victim, "capacity"))
                count, total, own_bytes = count - 1, total - victim_bytes, own_bytes - victim_bytes
            full = count >= self.max_sessions or total + nbytes > self.max_bytes
            if not full:
                db.execute(
                    f"insert into sessions ({_COLUMNS}) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        session.id,
                        session.owner,
                        nbytes,
                        *session.shape,
                        session.max_m,
                        session.info,
                        now,
                        now,
                        0,
                    ),
                )
                # named while the transaction holds the lock: no sweeper sees a file without its row
                os.rename(creating, self.state.file(SESSION_FILE + session.id))
        return evicted, full

    @contextmanager
    def use(self, session_id: str, owner: str = "anonymous", *, forward: bool = False):
        """The session, marked as used now (and its forward counted); NOT_FOUND if it does not
        exist (any more) or belongs to another owner."""
        now = self._clock()
        db = self._db.get()
        row = db.execute(
            f"update sessions set last_used = ?, forwards = forwards + ? "
            f"where id = ? and owner = ? and last_used >= ? returning {_COLUMNS}",
            (now, int(forward), session_id, owner, now - self.ttl),
        ).fetchone()
        if row is None:
            found = db.execute("select owner from sessions where id = ?", (session_id,)).fetchone()
            if found is None:  # gone (through another worker, perhaps): unmapped here too
                self._retire_local([session_id])
            elif found[0] == owner:  # expired: it goes now
                with transaction(db):
                    expired = db.execute(
                        "delete from sessions where id = ? and last_used < ? returning id",
                        (session_id, now - self.ttl),
                    ).fetchall()
                self._forget([(sid, "ttl") for (sid,) in expired])
            raise errors.not_found(_MISSING)
        session = self._hold(Session.from_row(row))
        try:
            yield session
        finally:
            self._let_go(session)

    def _hold(self, found: Session) -> Session:
        """This worker's mapped session of the row `found`, held for a call: mapped now if it
        is the first use here."""
        with self._lock:
            session = self._local.get(found.id)
            if session is not None and not session.retired:
                session.users += 1
                session.last_used, session.forward_count = found.last_used, found.forward_count
                return session
        try:
            found.memory = _map_memory(self.state.file(SESSION_FILE + found.id), found.nbytes)
        except FileNotFoundError:  # released between the lookup and now
            raise errors.not_found(_MISSING) from None
        try:
            found.context = self._attach(found.memory, found.max_m)
        except BaseException:
            found.close()
            raise
        with self._lock:
            session = self._local.get(found.id)
            if session is None or session.retired:  # else another thread mapped it meanwhile
                session, found = found, None
                self._local[session.id] = session
            session.users += 1
        if found is not None:
            found.close()
        return session

    def _let_go(self, session: Session) -> None:
        with self._lock:
            session.users -= 1
            last = session.retired and session.users == 0
        if last:
            session.close()

    def release(self, session_id: str, owner: str = "anonymous") -> None:
        db = self._db.get()
        with transaction(db):
            gone = db.execute(
                "delete from sessions where id = ? and owner = ? returning id", (session_id, owner)
            ).fetchall()
        if not gone:
            raise errors.not_found("no such quantized inner-product session")
        self._forget([(session_id, None)])

    def sweep(self) -> int:
        """Expire idle sessions now, remove the files of sessions gone (or of creations a
        killed worker left), and unmap this worker's sessions that are gone; returns how many
        expired."""
        db = self._db.get()
        with transaction(db):
            expired = [
                sid
                for (sid,) in db.execute(
                    "delete from sessions where last_used < ? returning id", (self._clock() - self.ttl,)
                )
            ]
            live = {sid for (sid,) in db.execute("select id from sessions")}
            _remove_orphans(self.state, live)
        self._forget([(sid, "ttl") for sid in expired])
        with self._lock:
            gone = [sid for sid in self._local if sid not in live]
        self._retire_local(gone)
        if self._made_since_trim:  # after the call: its request's buffers are free by now
            self._made_since_trim = False
            _return_freed_memory()
        return len(expired)

    def close(self) -> None:
        """Unmap this worker's sessions (they stay in the store for the other workers)."""
        with self._lock:
            sessions, self._local = list(self._local.values()), {}
            closing = []
            for session in sessions:
                session.retired = True
                if session.users == 0:
                    closing.append(session)
        for session in closing:
            session.close()
        self._db.close()

    # ---- internals
    def _forget(self, gone: list[tuple[str, str | None]]) -> None:
        """Sessions this worker removed from the store (with the reason to count, if evicted):
        remove their files, and unmap them here once their calls here have ended."""
        for session_id, reason in gone:
            if reason is not None:
                self._on_evict(reason)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.state.file(SESSION_FILE + session_id))
        self._retire_local([session_id for session_id, _ in gone])

    def _retire_local(self, session_ids: list[str]) -> None:
        """Unmap these sessions here (now, or when their last call here ends)."""
        closing = []
        with self._lock:
            for session_id in session_ids:
                session = self._local.pop(session_id, None)
                if session is not None:
                    session.retired = True
                    if session.users == 0:
                        closing.append(session)
        for session in closing:
            session.close()


def _return_freed_memory() -> None:
    """Give the heap's free pages back to the system. The server keeps freed buffers for
    reuse (tensorops.retain_freed_buffers), and a session's request leaves B's size of them
    (the pieces its message arrived in) beside the session's own copy; sessions are few and
    long-lived, so the sweep after a creation returns that memory instead (a few
    milliseconds; what is still in use then, or not at the heap's free pages, stays)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing kept that way
        pass


def _new_memory(path: str, nbytes: int) -> mmap.mmap:
    """A new file of `nbytes` (its pages reserved now: a full /dev/shm is an error here, not a
    SIGBUS later), mapped for writing."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, max(nbytes, 1))
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EFBIG):
                raise errors.exhausted(
                    f"no room for the session's {nbytes} bytes in {os.path.dirname(path)} (give the server's "
                    "/dev/shm more room, or release sessions)",
                    field="b",
                ) from None
            raise
        return mmap.mmap(fd, max(nbytes, 1))
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


def _map_memory(path: str, nbytes: int) -> mmap.mmap:
    """The memory of a session another worker created, mapped read-only."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return mmap.mmap(fd, nbytes, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


def _discard(path: str, memory: list[mmap.mmap]) -> None:
    for m in memory:
        with contextlib.suppress(BufferError):
            m.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _remove_orphans(state: StateDir, live: set[str]) -> None:
    """Remove the session files without a session (its remover died before removing the
    file) and the half-made ones of creators that died. Called in a write transaction, so no
    creation is between naming its file and committing its row."""
    for name in os.listdir(state.path):
        if name.startswith(SESSION_FILE):
            orphan = name[len(SESSION_FILE) :] not in live
        elif name.startswith(CREATING_FILE):
            pid = name[len(CREATING_FILE) :].partition("-")[0]
            orphan = pid.isdigit() and not _alive(int(pid))
        else:
            continue
        if orphan:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(state.file(name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Sweeper(threading.Thread):
    """Runs the stores' sweeps in the background: idle sessions expire and their memory goes
    back without traffic, and what other workers removed is unmapped here."""

    def __init__(self, sweeps: tuple[Callable[[], object], ...], interval: float):
        super().__init__(name="tensorops-session-sweeper", daemon=True)
        self._sweeps = sweeps
        self._interval = interval
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self._interval):
            for sweep in self._sweeps:
                try:
                    sweep()
                except Exception:  # the next sweep tries again; the thread must go on
                    log.exception("sweep failed")

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join()
