"""The state every worker process of one server shares, in a directory of its own.

- `state.sqlite`: the quantized inner-product sessions, the session models loaded through
  KServe and the registered shared-memory regions (who owns them, when they were last used,
  the bytes they hold). SQLite in WAL mode: any worker reads and changes it, one change at a
  time, and a worker killed in the middle of a change leaves it consistent (SQLite rolls the
  change back; the kernel drops the dead process's file locks).
- `session-<id>`: the memory of one session (its parameters and packed B), mapped by every
  worker that uses the session, so B is stored once whatever the number of workers.
- `lock`: held (flock) by the process that created the directory for as long as it runs.

The directory is on /dev/shm (memory, no disk writes) when that can be written, else in the
temporary directory. The process that starts the server (the supervisor, or the server
itself with one worker) creates it and removes it when it stops; a directory whose creator
was killed (its lock is free) is removed by the next server that starts.

This module imports neither grpc nor the kernels: the supervisor uses it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import tempfile
import threading
from typing import Any

PREFIX = "tensorops-state-"
DATABASE = "state.sqlite"
LOCK = "lock"
SESSION_FILE = "session-"
# A session's memory while it is being written: `creating-<pid>-<id>`, renamed to
# `session-<id>` when its row is committed (so a creator killed meanwhile leaves a file the
# sweepers recognize by its dead pid).
CREATING_FILE = "creating-"
# Seconds a worker waits for another's change of the state (they take microseconds).
BUSY_TIMEOUT = 30.0

SCHEMA = """
create table if not exists sessions (
    id text primary key,
    owner text not null,
    nbytes integer not null,
    n integer not null,
    k integer not null,
    max_m integer not null,
    info text not null,
    created real not null,
    last_used real not null,
    forwards integer not null default 0
);
create index if not exists sessions_by_owner on sessions (owner, last_used);
create index if not exists sessions_by_use on sessions (last_used);
create table if not exists models (
    owner text not null,
    name text not null,
    session_id text not null,
    n integer not null,
    k integer not null,
    primary key (owner, name)
);
create table if not exists model_statistics (
    owner text not null,
    name text not null,
    success_count integer not null,
    success_ns integer not null,
    fail_count integer not null,
    fail_ns integer not null,
    last_inference_ms integer not null,
    primary key (owner, name)
);
create table if not exists regions (
    owner text not null,
    name text not null,
    key text not null,
    offset integer not null,
    byte_size integer not null,
    device integer not null,
    inode integer not null,
    serial text not null,
    primary key (owner, name)
);
"""


def _base_directory() -> str:
    """/dev/shm when it can be written (the state lives in memory), else the temp directory."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


class StateDir:
    """A server's state directory. `create()` makes a new one (and holds its lock until
    `remove()`); `join(path)` opens the one a supervisor created, from a worker."""

    def __init__(self, path: str, lock_fd: int | None):
        self.path = path
        self._lock_fd = lock_fd  # set in the creating process only

    @classmethod
    def create(cls, base: str | None = None) -> StateDir:
        base = base or _base_directory()
        remove_abandoned(base)
        path = tempfile.mkdtemp(prefix=PREFIX, dir=base)
        # locked before it takes its name: a starting server never sees a free `lock` here
        lock_fd = os.open(os.path.join(path, LOCK + ".new"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(os.path.join(path, LOCK + ".new"), os.path.join(path, LOCK))
        state = cls(path, lock_fd)
        with contextlib.closing(state.connect()) as db:
            db.executescript(SCHEMA)
        return state

    @classmethod
    def join(cls, path: str) -> StateDir:
        if not os.path.isfile(os.path.join(path, DATABASE)):
            raise OSError(f"{path} is not a tensorops state directory")
        return cls(path, None)

    @property
    def owned(self) -> bool:
        return self._lock_fd is not None

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def connect(self) -> sqlite3.Connection:
        """A connection to the state database, in autocommit mode (transactions are explicit:
        `with transaction(db):`). One per thread."""
        db = sqlite3.connect(self.file(DATABASE), timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
        db.execute("pragma journal_mode=wal")
        # The state lives as long as the server: durability across a machine crash is not needed.
        db.execute("pragma synchronous=off")
        return db

    def remove(self) -> None:
        """Delete the directory (the creating process, when the server stops)."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


@contextlib.contextmanager
def transaction(db: sqlite3.Connection):
    """A write transaction: taken at once (so that checks and changes in it see no other
    worker's change in between), committed at the end, rolled back on an exception."""
    db.execute("begin immediate")
    try:
        yield db
    except BaseException:
        db.execute("rollback")
        raise
    db.execute("commit")


class Connections:
    """One connection per thread (a SQLite connection must not be used by two threads at once)."""

    def __init__(self, state: StateDir):
        self._state = state
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._state.connect()
            with self._lock:
                self._all.append(db)
        return db

    def close(self) -> None:
        with self._lock:
            dbs, self._all = self._all, []
        for db in dbs:
            with contextlib.suppress(sqlite3.Error):
                db.close()


def remove_abandoned(base: str) -> list[str]:
    """Remove the state directories in `base` whose creator is gone (their lock is free)."""
    removed = []
    try:
        names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(base, name)
        try:
            fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue  # not one of ours, or being created right now
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # its server runs
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
        removed.append(path)
    return removed


# How many sessions and regions there are and the bytes they hold (add a `where` for one owner's).
SESSION_USAGE = "select count(*), coalesce(sum(nbytes), 0) from sessions"
REGION_USAGE = "select count(*), coalesce(sum(byte_size), 0) from regions"


def usage(db: sqlite3.Connection) -> dict[str, Any]:
    """What the sessions and regions of the server hold, for its metrics."""
    sessions, session_bytes = db.execute(SESSION_USAGE).fetchone()
    regions, region_bytes = db.execute(REGION_USAGE).fetchone()
    return {"sessions": sessions, "session_bytes": session_bytes, "regions": regions, "region_bytes": region_bytes}


def totals(path: str) -> dict[str, Any]:
    """`usage` of the state directory at `path` (the supervisor's view)."""
    with contextlib.closing(StateDir.join(path).connect()) as db:
        return usage(db)
