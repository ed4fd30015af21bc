"""The session store: ids, TTL, count and memory caps with LRU eviction, concurrent use, and
the same books kept for several worker processes: two stores on one state directory are two
workers (each with its own connections and mappings), and some tests use real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import pytest

from tensorops_server.errors import Failure
from tensorops_server.sessions import SessionStore, Sweeper
from tensorops_server.statedir import PREFIX, StateDir, remove_abandoned


class Context:
    """A stand-in for the kernel's context: its memory, taken from the store, holds `tag` in
    every byte; a context attached in another worker reads the same memory."""

    def __init__(self, allocate=None, nbytes=1, tag=7):
        self.closed = 0
        self.n, self.k, self.max_m, self.info = 3, 2, 1, "test"
        if allocate is not None:
            self.memory = allocate(nbytes)
            self.memory[:] = bytes([tag]) * nbytes
        self.attached = allocate is None

    @classmethod
    def attach(cls, memory, max_m):
        context = cls()
        context.memory = memory
        return context

    @property
    def tag(self) -> int:
        return self.memory[0]

    def close(self):
        self.closed += 1


class Clock:
    def __init__(self):
        self.now = time.monotonic()

    def __call__(self):
        return self.now


@pytest.fixture
def state():
    state = StateDir.create()
    yield state
    state.remove()


def store_of(state, clock=None, evicted=None, **kwargs):
    defaults = dict(max_sessions=3, max_bytes=1000, ttl=60.0)
    return SessionStore(
        state,
        attach=Context.attach,
        **dict(defaults, **kwargs),
        clock=clock or time.monotonic,
        on_evict=(evicted.append if evicted is not None else None),
    )


def make(state, **kwargs):
    clock, evicted = Clock(), []
    return store_of(state, clock, evicted, **kwargs), clock, evicted


def add(store, nbytes=1, owner="anonymous", tag=7):
    """A new session of `nbytes`; its context."""
    made = []

    def build(allocate):
        made.append(Context(allocate, nbytes, tag))
        return made[-1]

    return store.create(build, owner), made[0]


def files(state):
    return sorted(n for n in os.listdir(state.path) if n.startswith(("session-", "creating-")))


def test_ids_are_long_random_and_distinct(state):
    store, _, _ = make(state, max_sessions=100)
    ids = {add(store)[0].id for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) >= 20 for i in ids)


def test_unknown_id_is_not_found(state):
    store, _, _ = make(state)
    with pytest.raises(Failure) as err:
        with store.use("nope"):
            pass
    assert err.value.code == grpc.StatusCode.NOT_FOUND and err.value.field == "session_id"


def test_count_cap_evicts_least_recently_used(state):
    store, clock, evicted = make(state, max_sessions=2)
    a, ca = add(store, 10)
    clock.now += 1
    b, cb = add(store, 10)
    clock.now += 1
    with store.use(a.id):  # a becomes the most recently used
        pass
    clock.now += 1
    add(store, 10)
    assert cb.closed == 1 and ca.closed == 0 and evicted == ["capacity"]
    with pytest.raises(Failure):
        with store.use(b.id):
            pass
    assert len(store) == 2 and store.nbytes == 20 and len(files(state)) == 2


def test_memory_cap_evicts_until_the_new_session_fits(state):
    store, clock, evicted = make(state, max_sessions=10, max_bytes=100)
    contexts = []
    for _ in range(3):
        contexts.append(add(store, 40)[1])
        clock.now += 1
    assert [c.closed for c in contexts] == [1, 0, 0]
    add(store, 90)
    assert [c.closed for c in contexts] == [1, 1, 1] and store.nbytes == 90
    assert evicted == ["capacity"] * 3 and len(files(state)) == 1


def test_session_larger_than_the_cap_is_refused_before_its_memory_is_taken(state):
    store, _, _ = make(state, max_bytes=100)
    with pytest.raises(Failure) as err:
        add(store, 101)
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.value.field == "b"
    assert files(state) == [] and len(store) == 0


def test_a_failed_creation_leaves_no_memory(state):
    store, _, _ = make(state)

    def build(allocate):
        allocate(64)
        raise ValueError("packing failed")

    with pytest.raises(ValueError):
        store.create(build)
    assert files(state) == [] and len(store) == 0


def test_idle_sessions_expire_and_use_refreshes(state):
    store, clock, evicted = make(state, ttl=10.0)
    a, ca = add(store)
    b, cb = add(store)
    clock.now += 8
    with store.use(a.id):
        pass
    clock.now += 8  # b idle 16 s, a idle 8 s
    assert store.sweep() == 1 and cb.closed == 1 and ca.closed == 0
    with store.use(a.id):
        pass
    clock.now += 11
    with pytest.raises(Failure):  # expired on access, even before a sweep
        with store.use(a.id):
            pass
    assert ca.closed == 1 and evicted == ["ttl", "ttl"] and len(store) == 0 and store.nbytes == 0
    assert files(state) == []


def test_eviction_while_in_use_closes_after_the_last_user(state):
    store, clock, _ = make(state, max_sessions=1)
    a, ca = add(store)
    with store.use(a.id) as session:
        clock.now += 1
        add(store)  # evicts a while it is in use
        assert ca.closed == 0 and session.retired and session.context.tag == 7
    assert ca.closed == 1


def test_release(state):
    store, _, evicted = make(state)
    s, c = add(store, 5)
    store.release(s.id)
    assert c.closed == 1 and len(store) == 0 and store.nbytes == 0 and evicted == [] and files(state) == []
    with pytest.raises(Failure) as err:
        store.release(s.id)
    assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_another_owner_sees_nothing_and_changes_nothing(state):
    store, _, _ = make(state)
    s, c = add(store, 5, owner="alice")
    for action in (lambda: store.release(s.id, "bob"), lambda: store.use(s.id, "bob").__enter__()):
        with pytest.raises(Failure) as err:
            action()
        assert err.value.code == grpc.StatusCode.NOT_FOUND
    assert store.snapshot("bob") == [] and [x.id for x in store.snapshot("alice")] == [s.id]
    with store.use(s.id, "alice") as session:
        assert session.context is c and c.closed == 0 and len(files(state)) == 1


@pytest.mark.parametrize("workers", [1, 2])
def test_concurrent_use_and_churn_keep_the_books_straight(state, workers):
    """Threads of one worker, or of two workers, creating, using and evicting at once."""
    stores = [store_of(state, max_sessions=4, max_bytes=10_000) for _ in range(workers)]
    contexts = []
    lock = threading.Lock()

    def worker(seed):
        for i in range(100):
            store = stores[(seed + i) % workers]
            s, c = add(store, 10 + (seed + i) % 7)
            with lock:
                contexts.append(c)
            try:
                with stores[(seed + i + 1) % workers].use(s.id, forward=True) as session:
                    assert session.context.closed == 0  # never closed while in use
                    assert session.context.tag == 7 and session.nbytes == 10 + (seed + i) % 7
            except Failure:
                pass  # evicted by another thread in between: fine
            assert len(store) <= 4  # never more, whichever worker counts

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for store in stores:
        store.sweep()
    live = stores[0].snapshot()
    assert len(live) <= 4 and stores[0].nbytes == sum(s.nbytes for s in live)
    assert len(files(state)) == len(live)
    assert sum(c.closed == 0 for c in contexts) == len({s.id for s in live})
    for store in stores:
        store.close()
    assert all(c.closed == 1 for c in contexts)


def test_sweeper_expires_in_the_background(state):
    store = store_of(state, max_sessions=4, max_bytes=100, ttl=0.05)
    _, c = add(store)
    sweeper = Sweeper((store.sweep,), interval=0.02)
    sweeper.start()
    try:
        for _ in range(100):
            if c.closed:
                break
            threading.Event().wait(0.02)
    finally:
        sweeper.stop()
    assert c.closed == 1 and len(store) == 0 and files(state) == []


# ---- several workers: two stores on one state directory


def test_a_session_made_by_one_worker_is_used_by_another_without_a_copy(state):
    clock = Clock()
    one, two = store_of(state, clock), store_of(state, clock)
    s, made = add(one, 100, tag=42)
    with two.use(s.id, forward=True) as there:
        assert there.context is not made and there.context.attached and there.context.tag == 42
        assert there.shape == (3, 2) and there.nbytes == 100
    with one.use(s.id, forward=True) as here:
        assert here.context is made and here.forward_count == 2
    assert len(files(state)) == 1  # one copy of the memory for both
    assert [x.forward_count for x in two.snapshot()] == [2]


def test_release_through_one_worker_ends_the_session_on_every_worker(state):
    clock = Clock()
    one, two = store_of(state, clock), store_of(state, clock)
    s, made = add(one)
    with two.use(s.id) as there:
        pass
    two.release(s.id)
    assert files(state) == [] and there.context.closed == 1
    with pytest.raises(Failure) as err:
        with one.use(s.id):
            pass
    assert err.value.code == grpc.StatusCode.NOT_FOUND and made.closed == 1


def test_the_other_worker_unmaps_a_released_session_at_its_sweep(state):
    clock = Clock()
    one, two = store_of(state, clock), store_of(state, clock)
    s, made = add(one)
    two.release(s.id)
    assert made.closed == 0
    one.sweep()
    assert made.closed == 1


def test_caps_hold_for_all_workers_together(state):
    clock = Clock()
    evicted = []
    one = store_of(state, clock, evicted, max_sessions=2, max_sessions_per_owner=2)
    two = store_of(state, clock, evicted, max_sessions=2, max_sessions_per_owner=2)
    a, ca = add(one, owner="alice")
    clock.now += 1
    add(two, owner="alice")
    clock.now += 1
    add(two, owner="alice")  # evicts alice's least recently used, made by the other worker
    assert evicted == ["capacity"] and len(one) == len(two) == 2
    one.sweep()
    assert ca.closed == 1
    with pytest.raises(Failure) as err:  # full of alice's sessions: bob is refused, alice keeps hers
        add(one, owner="bob")
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and len(files(state)) == 2


def test_two_workers_releasing_one_session_at_once_one_succeeds(state):
    one, two = store_of(state, max_sessions=100), store_of(state, max_sessions=100)
    for _ in range(30):
        s, _ = add(one)
        barrier = threading.Barrier(2)
        outcomes = []

        def release(store, s=s, barrier=barrier, outcomes=outcomes):
            barrier.wait()
            try:
                store.release(s.id)
                outcomes.append("released")
            except Failure as failure:
                outcomes.append(failure.code)

        threads = [threading.Thread(target=release, args=(store,)) for store in (one, two)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(map(str, outcomes)) == sorted(["released", str(grpc.StatusCode.NOT_FOUND)])
    assert len(one) == 0 and files(state) == []


def test_a_forward_that_found_the_session_completes_when_another_worker_releases_it(state):
    one, two = store_of(state), store_of(state)
    s, _ = add(one, 64, tag=9)
    with two.use(s.id, forward=True) as there:
        one.release(s.id)
        assert there.context.tag == 9 and there.context.closed == 0  # its memory stays mapped
    with pytest.raises(Failure):  # the next forward on that worker: gone, and unmapped there
        with two.use(s.id):
            pass
    assert there.context.closed == 1


# ---- real processes

JOIN = """
import os, sys, time
sys.path[:0] = [{paths!r}]
from test_session_store import Context, add, store_of
from tensorops_server.statedir import StateDir
store = store_of(StateDir.join({path!r}))
"""


def run_worker(state, code: str, **kwargs) -> subprocess.Popen:
    here = os.path.dirname(__file__)
    source = textwrap.dedent(JOIN.format(paths=here, path=state.path)) + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE, text=True, **kwargs)


def test_a_session_outlives_the_worker_that_made_it(state):
    worker = run_worker(state, "s, _ = add(store, 512, tag=5); print(s.id, flush=True); os._exit(0)")
    session_id = worker.stdout.readline().strip()
    assert worker.wait(30) == 0
    store = store_of(state)
    with store.use(session_id) as session:
        assert session.context.tag == 5 and session.nbytes == 512


def test_a_worker_killed_while_making_a_session_leaves_nothing_behind(state):
    worker = run_worker(
        state,
        """
        def build(allocate):
            context = Context(allocate, 512)
            print("packed", flush=True)
            time.sleep(60)
        store.create(build)
        """,
    )
    assert worker.stdout.readline().strip() == "packed"
    assert [n.split("-")[0] for n in files(state)] == ["creating"]
    worker.send_signal(signal.SIGKILL)
    worker.wait(30)
    store = store_of(state)
    store.sweep()
    assert files(state) == [] and len(store) == 0


def test_the_state_of_a_killed_server_is_removed_by_the_next(tmp_path):
    maker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from tensorops_server.statedir import StateDir; import sys, time; "
            f"s = StateDir.create({str(tmp_path)!r}); print(s.path, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    path = maker.stdout.readline().strip()
    assert os.path.isdir(path) and remove_abandoned(str(tmp_path)) == []  # its server runs: kept
    maker.send_signal(signal.SIGKILL)
    maker.wait(30)
    assert remove_abandoned(str(tmp_path)) == [path] and not os.path.exists(path)
    live = StateDir.create(str(tmp_path))
    assert [n for n in os.listdir(tmp_path) if n.startswith(PREFIX)] == [os.path.basename(live.path)]
    live.remove()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("hostile", ["../lock", "../../etc/passwd", "session-x/..", "", "\0", "x" * 100_000])
def test_ids_never_reach_the_file_system(state, hostile):
    """A session id is only looked up, never made into a path: the state directory stays as it was."""
    store, _, _ = make(state)
    s, _ = add(store, 8)
    before = sorted(os.listdir(state.path))
    for action in (lambda: store.release(hostile), lambda: store.use(hostile).__enter__()):
        with pytest.raises(Failure) as err:
            action()
        assert err.value.code == grpc.StatusCode.NOT_FOUND
    store.sweep()
    assert sorted(os.listdir(state.path)) == before and os.path.exists(os.path.join(state.path, "lock"))
    with store.use(s.id) as session:
        assert session.context.tag == 7


def test_a_worker_killed_while_it_changes_the_state_blocks_no_one(state):
    """A worker killed inside a write transaction: the kernel drops its lock and SQLite rolls
    its change back, so the others go on with the state as it was."""
    store = store_of(state)
    kept, _ = add(store, 16)
    worker = run_worker(
        state,
        """
        from tensorops_server.statedir import transaction
        db = store._db.get()
        db.execute("begin immediate")
        db.execute("delete from sessions")
        print("changing", flush=True)
        time.sleep(60)
        """,
    )
    assert worker.stdout.readline().strip() == "changing"
    worker.send_signal(signal.SIGKILL)
    worker.wait(30)
    started = time.monotonic()
    made, _ = add(store, 16)  # a write: the dead worker's lock is gone
    assert time.monotonic() - started < 5
    assert sorted(s.id for s in store.snapshot()) == sorted([kept.id, made.id])
