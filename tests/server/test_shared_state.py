"""Two workers of one server (tests/support/workers.py): sessions made through one are
forwarded, described, listed, released and capped through the other, per caller, with
results bit-identical to tensorops_native in-process and no session made twice."""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest

import tensorops_native as tn
from tensorops.protocol import codec
from tensorops.v1 import tensorops_pb2 as pb
from tensorops.v1 import tensorops_pb2_grpc as pb_grpc
from workers import workers  # noqa: F401 (the fixture)

TOKENS = "token-alice,token-bob"
PARAMS = dict(a_scale=0.02, a_zero=3, c_scale=0.05, c_zero=5)


class Raw:
    """The session calls by id, through the generated stub: the SDK's sessions would make a
    session again where it is missing, and these tests must see every NOT_FOUND."""

    def __init__(self, target, token=None):
        self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.TensorOpsStub(self.channel)
        self.metadata = [("authorization", f"Bearer {token}")] if token else None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.channel.close()

    def create(self, b, b_scale) -> str:
        request = pb.CreateQuantizedInnerProductRequest(
            b=codec.from_array(b, "b"), b_scale=codec.from_array(b_scale, "b_scale"), **PARAMS
        )
        return self.stub.CreateQuantizedInnerProduct(request, metadata=self.metadata).session_id

    def forward(self, session_id, a):
        request = pb.QuantizedInnerProductForwardRequest(session_id=session_id, a=codec.from_array(a, "a"))
        c = self.stub.QuantizedInnerProductForward(request, metadata=self.metadata).c
        return np.array(codec.to_array(c, "c"))

    def describe(self, session_id):
        return self.stub.DescribeSession(pb.DescribeSessionRequest(session_id=session_id), metadata=self.metadata)

    def ids(self) -> list[str]:
        listed = self.stub.ListSessions(pb.ListSessionsRequest(), metadata=self.metadata)
        return [s.session_id for s in listed.sessions]

    def release(self, session_id):
        self.stub.ReleaseSession(pb.ReleaseSessionRequest(session_id=session_id), metadata=self.metadata)


def refused(call, *args) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call(*args)
    return err.value.code()


def session_problem(seed=0, k=300, n=70):
    rng = np.random.default_rng(seed)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    b_scale = (rng.random(n) * 0.02 + 0.001).astype(np.float32)
    a = rng.integers(0, 256, (9, k), dtype=np.uint8)
    return a, b, b_scale


def test_a_session_made_through_one_worker_is_served_by_the_other(workers):
    w = workers()
    a, b, b_scale = session_problem()
    expected = tn.QuantizedInnerProduct(b, b_scale=b_scale, **PARAMS).forward(a)
    with Raw(w.target(0)) as one, Raw(w.target(1)) as two:
        made = one.create(b, b_scale)
        assert np.array_equal(two.forward(made, a), expected)
        assert np.array_equal(one.forward(made, a[:3]), expected[:3])
        described = two.describe(made)
        assert (described.n, described.k, described.forward_count) == (70, 300, 2)
        assert one.ids() == two.ids() == [made]  # one session, made once
        two.release(made)
        assert refused(one.describe, made) == grpc.StatusCode.NOT_FOUND
        assert refused(one.forward, made, a) == grpc.StatusCode.NOT_FOUND
    assert [n for n in os.listdir(w.state.path) if n.startswith("session-")] == []


def test_session_caps_and_owners_hold_across_workers(workers):
    w = workers(auth_tokens=TOKENS, max_sessions=2, max_sessions_per_caller=2)
    a, b, b_scale = session_problem(k=40, n=8)
    with Raw(w.target(0), "token-alice") as alice_one, Raw(w.target(1), "token-alice") as alice_two:
        first = alice_one.create(b, b_scale)
        second = alice_two.create(b, b_scale)
        third = alice_two.create(b, b_scale)  # evicts alice's least recently used, made on the other worker
        assert sorted(alice_one.ids()) == sorted([second, third])
        assert refused(alice_one.forward, first, a) == grpc.StatusCode.NOT_FOUND
        with Raw(w.target(0), "token-bob") as bob:
            assert bob.ids() == []
            assert refused(bob.describe, second) == grpc.StatusCode.NOT_FOUND
            assert refused(bob.release, second) == grpc.StatusCode.NOT_FOUND
            # the server is full of alice's sessions: bob is refused, alice keeps hers
            assert refused(bob.create, b, b_scale) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert sorted(alice_two.ids()) == sorted([second, third])


def test_a_worker_that_stops_leaves_the_sessions_to_the_others(workers):
    w = workers()
    a, b, b_scale = session_problem(2, k=64, n=33)
    with Raw(w.target(0)) as one:
        made = one.create(b, b_scale)
        one.forward(made, a)
    w.stop_worker(0)
    with Raw(w.target(1)) as two:
        assert np.array_equal(two.forward(made, a), tn.QuantizedInnerProduct(b, b_scale=b_scale, **PARAMS).forward(a))
        assert two.ids() == [made]
