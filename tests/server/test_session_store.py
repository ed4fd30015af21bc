"""The session store: ids, TTL, count and memory caps with LRU eviction, concurrent use."""

from __future__ import annotations

import threading

import grpc
import pytest

from tensorops_server.errors import Failure
from tensorops_server.sessions import SessionStore, Sweeper


class Context:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make(**kwargs):
    clock = Clock()
    evicted = []
    defaults = dict(max_sessions=3, max_bytes=1000, ttl=60.0)
    store = SessionStore(**dict(defaults, **kwargs), clock=clock, on_evict=evicted.append)
    return store, clock, evicted


def test_ids_are_long_random_and_distinct():
    store, _, _ = make(max_sessions=100)
    ids = {store.add(Context(), 1, (1, 1)).id for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) >= 20 for i in ids)


def test_unknown_id_is_not_found():
    store, _, _ = make()
    with pytest.raises(Failure) as err:
        with store.use("nope"):
            pass
    assert err.value.code == grpc.StatusCode.NOT_FOUND and err.value.field == "session_id"


def test_count_cap_evicts_least_recently_used():
    store, _, evicted = make(max_sessions=2)
    ca, cb, cc = Context(), Context(), Context()
    a = store.add(ca, 10, (1, 1))
    b = store.add(cb, 10, (1, 1))
    with store.use(a.id):  # a becomes the most recently used
        pass
    store.add(cc, 10, (1, 1))
    assert cb.closed == 1 and ca.closed == 0 and evicted == ["capacity"]
    with pytest.raises(Failure):
        with store.use(b.id):
            pass
    assert len(store) == 2 and store.nbytes == 20


def test_memory_cap_evicts_until_the_new_session_fits():
    store, _, evicted = make(max_sessions=10, max_bytes=100)
    contexts = [Context() for _ in range(3)]
    for c in contexts:
        store.add(c, 40, (1, 1))
    assert [c.closed for c in contexts] == [1, 0, 0]
    store.add(Context(), 90, (1, 1))
    assert [c.closed for c in contexts] == [1, 1, 1] and store.nbytes == 90
    assert evicted == ["capacity"] * 3


def test_session_larger_than_the_cap_is_refused():
    store, _, _ = make(max_bytes=100)
    c = Context()
    with pytest.raises(Failure) as err:
        store.add(c, 101, (1, 1))
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and c.closed == 1


def test_idle_sessions_expire_and_use_refreshes():
    store, clock, evicted = make(ttl=10.0)
    ca, cb = Context(), Context()
    a = store.add(ca, 1, (1, 1))
    store.add(cb, 1, (1, 1))
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


def test_eviction_while_in_use_closes_after_the_last_user():
    store, _, _ = make(max_sessions=1)
    ca = Context()
    a = store.add(ca, 1, (1, 1))
    with store.use(a.id) as session:
        store.add(Context(), 1, (1, 1))  # evicts a while it is in use
        assert ca.closed == 0 and session.retired
    assert ca.closed == 1


def test_release():
    store, _, evicted = make()
    c = Context()
    s = store.add(c, 5, (1, 1))
    store.release(s.id)
    assert c.closed == 1 and len(store) == 0 and store.nbytes == 0 and evicted == []
    with pytest.raises(Failure) as err:
        store.release(s.id)
    assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_concurrent_use_and_churn_keep_the_books_straight():
    store = SessionStore(max_sessions=4, max_bytes=10_000, ttl=60.0)
    contexts = []
    lock = threading.Lock()

    def worker(seed):
        for i in range(200):
            c = Context()
            with lock:
                contexts.append(c)
            s = store.add(c, 10 + (seed + i) % 7, (1, 1))
            try:
                with store.use(s.id, forward=True) as session:
                    assert c.closed == 0  # never closed while in use
                    assert session.context is c
            except Failure:
                pass  # evicted by another thread in between: fine

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    live = store.snapshot()
    assert len(live) <= 4 and store.nbytes == sum(s.nbytes for s in live)
    assert all(c.closed == (0 if any(s.context is c for s in live) else 1) for c in contexts)
    store.close_all()
    assert all(c.closed == 1 for c in contexts) and store.nbytes == 0


def test_sweeper_expires_in_the_background():
    store = SessionStore(max_sessions=4, max_bytes=100, ttl=0.05)
    c = Context()
    store.add(c, 1, (1, 1))
    sweeper = Sweeper(store, interval=0.02)
    sweeper.start()
    try:
        for _ in range(100):
            if c.closed:
                break
            threading.Event().wait(0.02)
    finally:
        sweeper.stop()
    assert c.closed == 1 and len(store) == 0
