"""Property-based fuzzing of one live server (hypothesis): random, malformed and mutated
requests for every RPC of tensorops.v1.TensorOps.

Three families of examples, all against one server process with small limits (so each
example is cheap) that requires a bearer token:

- requests: random arguments of every stateless operation, encoded by the client's
  `wire.build_request`, some then mutated field by field through the protobuf descriptors
  (tensor dtypes, shapes, formats and payload lengths, enum numbers, scalars, repeated
  fields, nested messages; known and unknown values, NaN, infinities, huge numbers);
- sessions: a hypothesis state machine creating, using, describing, listing and
  releasing quantized inner-product sessions (valid and mutated requests, known and
  unknown ids), with a model of the server's least-recently-used eviction, and another
  caller (another token) or one without a valid token trying the same sessions;
- garbage: random bytes, and truncated, bit-flipped, duplicated and spliced valid
  requests, through a raw channel, for every RPC.

One call in ten carries another authorization header than the campaign's token: none, a
wrong or malformed one (UNAUTHENTICATED whatever the bytes), or another valid token.

Every answer is OK or INVALID_ARGUMENT / RESOURCE_EXHAUSTED / NOT_FOUND / UNAUTHENTICATED
within the per-call timeout, with details under 1100 characters. Beyond that the status
is predicted: the test decodes the bytes it sent with the codec, turns them into the
native function's arguments by the wire contract (see tensorops_server.optable) and runs
tensorops_native in-process. The server must fail where that fails (same code, same
field) and succeed where it succeeds, with a result equal bit for bit. After the run the
server is alive, SERVING, holds no session, counted no INTERNAL or UNKNOWN, logged no
error, and its memory (all its processes) never grew past its idle peak by more than
PEAK_GROWTH_BOUND.

TENSOROPS_FUZZ_EXAMPLES (default 3000) is the total number of examples; raise it for a
long campaign (docs/fuzz-and-soak.md).
"""

from __future__ import annotations

import inspect
import math
import os
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

import grpc
import ml_dtypes
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

import tensorops_native as tn
from rpc_server import ServerProcess, metric_value, resident_bytes
from tensorops import _errors
from tensorops.protocol import codec, dtypes, wire
from tensorops.v1 import tensor_pb2
from tensorops.v1 import tensorops_pb2 as pb

# float64 arguments beyond float32 become infinities in-process and on the server alike
pytestmark = [
    pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning"),
]

# ---------------------------------------------------------------------------------------
# The server under test and the budget

MAX_TENSOR = 1 << 20
MAX_MESSAGE = 4 << 20
RESULT_LIMIT = min(MAX_TENSOR, MAX_MESSAGE - 1024)  # the largest result a call may produce
MAX_SESSIONS = 4  # small: session churn exercises eviction
CALL_TIMEOUT = 10.0  # seconds; DEADLINE_EXCEEDED is a failure (a hang)
# How far the server's resident memory (every process of it) may peak above its idle peak:
# the caps' worth of tensors in flight plus allocator slack (see the last test).
PEAK_GROWTH_BOUND = 180 << 20
MAX_DETAILS = 1100  # characters of an error message

TOTAL_EXAMPLES = int(os.environ.get("TENSOROPS_FUZZ_EXAMPLES", "3000"))
SESSION_STEPS = 20  # steps per state-machine run; each step is one example
# Half the examples are requests, a fifth session calls, the rest garbage (with floors, so
# that each family sees every kind of answer it asserts on)
BUDGET = {
    "requests": max(100, TOTAL_EXAMPLES * 50 // 100),
    "sessions": max(10, TOTAL_EXAMPLES * 20 // 100 // SESSION_STEPS),
    "garbage": max(100, TOTAL_EXAMPLES * 30 // 100),
}

# The server requires a bearer token. Most calls carry the campaign's own; the others a
# header drawn from AUTH_HEADERS: another valid token (another caller: it sees none of the
# campaign's sessions), the same token spelled otherwise, or no, a wrong or a malformed one.
TOKEN, OTHER_TOKEN = "fuzz-token-0123456789", "other-token-9876543210"
AUTH_HEADERS = [
    None,
    f"Bearer {OTHER_TOKEN}",
    f"bearer {TOKEN}",
    f"BEARER  {TOKEN}",
    "Bearer wrong-token",
    f"Bearer {TOKEN}x",
    f"Bearer {TOKEN[:-1]}",
    "Bearer ",
    TOKEN,
    f"Basic {TOKEN}",
    f"Token {TOKEN}",
]


def authorized(header: str | None) -> bool:
    """The documented rule: `authorization: Bearer <token>` (the scheme in any case), the
    token one of the server's."""
    return header is not None and header[:7].lower() == "bearer " and header[7:].strip() in (TOKEN, OTHER_TOKEN)


ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED,
}
OK, INVALID, EXHAUSTED, NOT_FOUND, UNAUTHENTICATED = (
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED,
)


def fuzz_settings(examples: int, **kwargs) -> settings:
    # No example database: a failure prints the example (and a reproduce_failure blob),
    # and the worktree stays clean.
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
        **kwargs,
    )


@dataclass
class Answer:
    code: grpc.StatusCode
    details: str
    field: str | None
    data: bytes | None


class ServerDied(AssertionError):
    pass


class Campaign:
    """The server, one raw channel (bytes in, bytes out), and the tally of answers."""

    def __init__(self, server: ServerProcess):
        self.server = server
        self.channel = grpc.insecure_channel(
            server.target,
            options=[
                ("grpc.max_send_message_length", 64 << 20),
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.enable_retries", 0),
            ],
        )
        self._methods: dict[str, Any] = {}
        self.tally: Counter = Counter()  # (family, code name) -> calls
        self.by_rpc: Counter = Counter()  # (rpc, code name) -> calls
        self.death: str | None = None

    def call(self, family: str, rpc: str, raw: bytes, auth: str | None = f"Bearer {TOKEN}") -> Answer:
        """Send raw bytes with `authorization: <auth>` (none if None); check the properties
        every answer has."""
        if self.death:
            raise ServerDied(self.death)
        method = self._methods.get(rpc)
        if method is None:
            method = self._methods[rpc] = self.channel.unary_unary(wire.method_path(rpc))
        try:
            metadata = None if auth is None else (("authorization", auth),)
            answer = Answer(OK, "", None, method(raw, timeout=CALL_TIMEOUT, metadata=metadata))
        except grpc.RpcError as exc:
            answer = Answer(exc.code(), exc.details() or "", _errors.from_rpc_error(exc).field, None)
        self.tally[family, answer.code.name] += 1
        self.by_rpc[rpc, answer.code.name] += 1
        exited = self.server.proc.poll() is not None
        if exited or answer.code is grpc.StatusCode.DEADLINE_EXCEEDED:
            # Fatal: every later example fails at once with this message (which names the
            # request that did it) instead of waiting for a dead or stuck server.
            what = (
                f"exited with {self.server.proc.returncode}" if exited else f"did not answer within {CALL_TIMEOUT:g} s"
            )
            self.death = (
                f"the server {what} on {rpc} with request {raw[:256].hex()}"
                f"{'...' if len(raw) > 256 else ''} ({len(raw)} bytes)"
            )
            raise ServerDied(self.death)
        assert answer.code in ALLOWED, f"{rpc} answered {answer.code.name}: {answer.details!r}"
        assert len(answer.details) < MAX_DETAILS, f"{rpc}: {len(answer.details)} characters of details"
        return answer

    def codes(self, family: str) -> Counter:
        return Counter({code: n for (fam, code), n in self.tally.items() if fam == family})

    def summary(self) -> str:
        codes = Counter()
        for (_, code), n in self.tally.items():
            codes[code] += n
        families = Counter()
        for (fam, _), n in self.tally.items():
            families[fam] += n
        return (
            f"fuzz: {sum(codes.values())} calls; by status: "
            + ", ".join(f"{c} {n}" for c, n in codes.most_common())
            + "; by family: "
            + ", ".join(f"{f} {n}" for f, n in sorted(families.items()))
        )

    def close(self) -> None:
        self.channel.close()


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    server = ServerProcess(
        tmp_path_factory.mktemp("fuzz") / "server.log",
        "--max-tensor-bytes",
        str(MAX_TENSOR),
        "--max-message-bytes",
        str(MAX_MESSAGE),
        "--max-sessions",
        str(MAX_SESSIONS),
        env={"TENSOROPS_AUTH_TOKENS": f"{TOKEN},{OTHER_TOKEN}"},
    ).start()
    c = Campaign(server)
    c.idle_peak = resident_bytes(server.proc.pid, "VmHWM")
    try:
        yield c
    finally:
        c.close()
        code = server.stop()
    assert code == 0, server.log_path.read_text()[-4000:]


# ---------------------------------------------------------------------------------------
# What the server must answer: the request decoded as the server decodes it, the native
# function run in-process

TENSOR_TYPE = tensor_pb2.Tensor.DESCRIPTOR.full_name
BF16 = np.dtype(ml_dtypes.bfloat16)
U16 = np.dtype(np.uint16)


def is_tensor(f) -> bool:
    return f.message_type is not None and f.message_type.full_name == TENSOR_TYPE


@dataclass
class Expect:
    code: grpc.StatusCode | None  # None: in-process crashed (the answer only has to be allowed)
    field: str | None = None
    result: Any = None
    crash: str | None = None


def defaults_of(fn) -> frozenset[str]:
    return frozenset(p.name for p in inspect.signature(fn).parameters.values() if p.default is not p.empty)


def run_native(fn, *args, **kwargs) -> Expect:
    try:
        return Expect(OK, result=fn(*args, **kwargs))
    except (tn.ArgumentError, tn.ArgumentTypeError) as exc:
        return Expect(INVALID, exc.argument)
    except MemoryError:
        return Expect(EXHAUSTED)
    except Exception as exc:
        return Expect(None, crash=f"{type(exc).__name__}: {exc}")


class Refused(Exception):
    def __init__(self, expect: Expect):
        self.expect = expect


def tensor_value(op: wire.Operation, tensor, name: str, image: bool):
    """A received tensor as an array; only image tensors may carry a Format."""
    if tensor.format and not image:
        raise Refused(Expect(INVALID, f"{name}.format"))
    return codec.to_array(tensor, name, max_bytes=MAX_TENSOR)


def decode_arguments(
    op: wire.Operation, raw: bytes, defaults: frozenset[str] = frozenset(), skip: tuple[str, ...] = ()
) -> tuple[Any, dict]:
    """(message, native keyword arguments) of a request, by the wire contract: tensors
    become arrays (size limit, dtype, shape and payload checked), enums their API names,
    unset optional fields / UNSPECIFIED enums / empty repeated fields "not given" (left out
    when the function has a default), the image tensors' Format the `format` argument.
    Raises Refused with what the server must answer when the request cannot be decoded."""
    if len(raw) > MAX_MESSAGE:
        raise Refused(Expect(EXHAUSTED))
    try:
        decoded = op.request_codec.decode(raw)
        message, kwargs = decoded.message, {}
        # Fields in declaration order: the first one refused decides the answer.
        for f in op.request_class.DESCRIPTOR.fields:
            if f.name in skip:
                continue
            required = f.name not in defaults
            if is_tensor(f) and f.is_repeated:
                value = [
                    tensor_value(op, t, f"{f.name}[{i}]", f.name in op.layout)
                    for i, t in enumerate(decoded.tensors[f.name])
                ]
            elif is_tensor(f):
                tensor = decoded.tensors.get(f.name)
                value = None if tensor is None else tensor_value(op, tensor, f.name, f.name in op.layout)
            elif f.enum_type is not None:
                number = getattr(message, f.name)
                value = wire.decode_enum(f.enum_type, number)
                if value is None and (number or required):  # an unknown number, or a required one unset
                    raise Refused(Expect(INVALID, f.name))
            elif f.is_repeated:
                value = list(getattr(message, f.name)) or None
            elif f.has_presence:
                value = getattr(message, f.name) if message.HasField(f.name) else None
            else:
                value = getattr(message, f.name)
            if value is None:
                if required:  # a required tensor or field left unset
                    raise Refused(Expect(INVALID, f.name))
                continue
            kwargs[f.name] = value
    except codec.WireError as exc:
        raise Refused(Expect(getattr(grpc.StatusCode, exc.code), exc.field)) from None
    except Exception as exc:
        raise Refused(Expect(None, crash=f"codec: {type(exc).__name__}: {exc}")) from None
    fmt = 0
    for name in op.layout:  # the image tensors agree on one Format (UNSPECIFIED agrees with any)
        tensor = decoded.tensors.get(name)
        if tensor is None or not tensor.format:
            continue
        if tensor.format not in dtypes.FORMAT_NAMES or (fmt and tensor.format != fmt):
            raise Refused(Expect(INVALID, f"{name}.format"))
        fmt = tensor.format
    if fmt:
        kwargs["format"] = dtypes.FORMAT_NAMES[fmt]
    activation = kwargs.get("activation")
    if activation is not None:  # normalize(): (name, *parameters); the type is required
        name = wire.decode_enum(pb.Activation.DESCRIPTOR, activation.type)
        if name is None:
            raise Refused(Expect(INVALID, "activation.type"))
        kwargs["activation"] = (name, *activation.params)
    return message, kwargs


def result_check(kwargs: dict, n: int, rows_field: str = "a") -> Expect | None:
    """The quantized inner products refuse a result above the limit before anything else."""
    a = kwargs.get(rows_field)
    if isinstance(a, np.ndarray) and a.ndim == 2 and a.shape[0] * n > RESULT_LIMIT:
        return Expect(EXHAUSTED, rows_field)
    return None


def channel_sum_check(kwargs: dict) -> Expect | None:
    """channel_sum's (batch, channels) float32 result can be far larger than its request (an
    empty x of a large batch and channel count): refused above the limit before anything
    else. (In-process, such a call would take gigabytes.)"""
    x = kwargs.get("x")
    if isinstance(x, np.ndarray) and x.ndim >= 2:
        channels = x.shape[-1] if kwargs.get("format") == "nhwc" else x.shape[1]
        if x.shape[0] * channels * 4 > RESULT_LIMIT:
            return Expect(EXHAUSTED, "x")
    return None


def predict(op: wire.Operation, raw: bytes, fn, args: dict | None = None) -> Expect:
    """What the server must answer to `raw`. With `args` (the Python arguments `raw` was
    built from), the native function runs on those, as a caller in-process would."""
    defaults = defaults_of(fn)
    try:
        _, kwargs = decode_arguments(op, raw, defaults)
    except Refused as refused:
        return refused.expect
    if op.name == "quantized_inner_product":
        b = kwargs.get("b")
        if isinstance(kwargs.get("a"), np.ndarray) and isinstance(b, np.ndarray) and b.ndim == 2:
            too_large = result_check(kwargs, b.shape[0] if kwargs.get("trans_b") else b.shape[1])
            if too_large:
                return too_large
    if op.name == "channel_sum" and (too_large := channel_sum_check(kwargs)):
        return too_large
    if args is not None:
        kwargs = {k: v for k, v in args.items() if not (v is None and k in defaults)}
    return run_native(fn, **kwargs)


def nbytes(result) -> int:
    return sum(r.nbytes for r in result) if isinstance(result, tuple) else result.nbytes


def same_bits(expected, got) -> bool:
    if isinstance(expected, tuple):
        return isinstance(got, tuple) and len(expected) == len(got) and all(map(same_bits, expected, got))
    dtypes_agree = expected.dtype == got.dtype or {expected.dtype, got.dtype} <= {BF16, U16}
    return (
        dtypes_agree
        and expected.shape == got.shape
        and np.ascontiguousarray(expected).tobytes() == np.ascontiguousarray(got).tobytes()
    )


def check(answer: Answer, expect: Expect, decode=None) -> None:
    """The answer is the predicted one; an OK result (decode(answer.data)) equals bit for
    bit the in-process result."""
    if expect.code is None:
        return  # in-process crashed; the answer was allowed (Campaign.call)
    if expect.code is OK:
        if answer.code is EXHAUSTED and nbytes(expect.result) > RESULT_LIMIT:
            return  # a result above the limits may be refused
        assert answer.code is OK, f"the server answered {answer.code.name} ({answer.details}); in-process: OK"
        if decode is not None:
            got, expected = decode(answer.data), expect.result
            assert same_bits(expected, got), f"results differ:\nserver {got!r}\nin-process {expected!r}"
        return
    # A request can be wrong in several ways at once, and the server checks in an order of
    # its own: the answer must be a clean refusal, naming a field where this model names
    # one, though not necessarily the first fault the model found.
    if expect.code is UNAUTHENTICATED:
        assert answer.code is UNAUTHENTICATED, f"the server answered {answer.code.name} ({answer.details})"
        return
    assert answer.code in (INVALID, EXHAUSTED, NOT_FOUND), (
        f"the server answered {answer.code.name} ({answer.details}); expected a refusal "
        f"({expect.code.name} for field {expect.field})"
    )
    if expect.field is not None:
        assert answer.field, f"{answer.details!r} names no field; expected {expect.field}"


# ---------------------------------------------------------------------------------------
# Arrays and Python arguments

F32, F16, F64 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)
I8, U8, I32 = np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32)
BITS = "bf16 bits"  # uint16 holding BF16 bits
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 1.2e-38, 3.4e38, -3.4e38, 65504.0, 1.0, -1.0])
SPECIAL_DOUBLES = [
    0.0,
    -0.0,
    1e-5,
    1e-3,
    0.5,
    1.0,
    -1.0,
    -1e-5,
    math.nan,
    math.inf,
    -math.inf,
    1e39,
    3.4e38,
    5e-324,
    1e-45,
    1e300,
    -1e300,
]
SPECIAL_INTS = [0, 1, 2, 3, 7, -1, -2, 255, 256, 2**31 - 1, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63)]
# Dimensions of malformed shapes (an empty tensor may have huge dimensions)
WILD_DIMS = [0, 1, 2, 3, 4, 5, 7, 8, 16, -1, -7, -(2**63), 2**20, 2**24, 2**31, 2**32 + 1, 2**40, 2**62, 2**63 - 1]
ITEMSIZE = {d.wire: d.itemsize for d in dtypes.DTYPES}


def mostly(good, bad, one_in: int = 10):
    """`good`, and `bad` one time in `one_in`: each argument is valid most of the time, so
    that a good share of the calls succeed."""
    # (sampled_from draws its index without integers()' preference for the bounds)
    return st.sampled_from(range(one_in)).flatmap(lambda i: bad if i == 0 else good)


SIZES = st.sampled_from(["tiny"] * 3 + ["small"] * 5 + ["medium"] * 2 + ["large"])


def dim(size: str):
    return {
        "tiny": st.integers(0, 3),
        "small": st.integers(1, 6),
        "medium": st.integers(1, 24),
        "large": st.integers(1, 4),
    }[size]


@st.composite
def array(draw, shape, dtype):
    """Random values of every flavour (normal, wide range, NaN / infinities / denormals /
    signed zeros, constant) for floats; the whole range for integers."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    size = math.prod(shape)
    bits = dtype == BITS
    dtype = BF16 if bits else np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, size, dtype=dtype).reshape(shape)
    flavour = draw(st.sampled_from(["normal", "normal", "wide", "special", "constant"]))
    values = rng.standard_normal(size)
    if flavour == "wide":
        values *= 10.0 ** rng.integers(-40, 40, size)
    elif flavour == "special":
        mask = rng.random(size) < 0.3
        values[mask] = rng.choice(SPECIAL, int(mask.sum()))
    elif flavour == "constant":
        values[:] = rng.choice(SPECIAL)
    with np.errstate(over="ignore", invalid="ignore"):
        arr = values.astype(dtype).reshape(shape)
    return arr.view(np.uint16) if bits else arr


def fill(shape: list[int], index: int, draw) -> list[int]:
    """A large tensor: dimension `index` sized to make 60K - 300K elements (about the 1 MiB
    tensor limit for 4-byte elements)."""
    rest = math.prod(d for i, d in enumerate(shape) if i != index) or 1
    shape[index] = max(1, draw(st.integers(60_000, 300_000)) // rest)
    return shape


@st.composite
def image(draw, size, channels, nhwc, dtype, rank=None):
    rank = rank if rank is not None else draw(st.integers(2, 4))
    batch = draw(st.integers(0 if size == "tiny" else 1, 3))
    spatial = [draw(dim(size)) for _ in range(rank - 2)]
    shape = [batch, *spatial, channels] if nhwc else [batch, channels, *spatial]
    if size == "large":  # a spatial dimension grows (the batch, for 2-D tensors)
        shape = fill(shape, 0 if rank == 2 else 1 if nhwc else len(shape) - 1, draw)
    return draw(array(tuple(shape), dtype))


@st.composite
def plain_shape(draw, size, min_rank=0, max_rank=3):
    shape = [draw(dim(size)) for _ in range(draw(st.integers(min_rank, max_rank)))]
    if size == "large" and shape:
        shape = fill(shape, len(shape) - 1, draw)
    return tuple(shape)


@st.composite
def per_channel(draw, channels, kinds=("f32", "f32", "f32", "list", "f64", "i32", "f16", "bf16")):
    """Parameters of `channels` values (sometimes another count), in various dtypes."""
    n = draw(mostly(st.just(channels), st.integers(0, 9)))
    kind = draw(mostly(st.sampled_from(kinds[:5]), st.sampled_from(kinds[5:])))
    if kind == "list":
        return [float(v) for v in draw(array((n,), F64))]
    return draw(array((n,), {"f32": F32, "f64": F64, "i32": I32, "f16": F16, "bf16": BF16}[kind]))


FORMAT_ARGS = st.sampled_from([None, "nchw", "nhwc", "NHWC", 0, 1])
EPS = mostly(
    st.one_of(st.none(), st.sampled_from([1e-5, 1e-3, 0.0, 0.5]), st.floats(0, 1)), st.sampled_from(SPECIAL_DOUBLES)
)
CHANNELS = mostly(st.integers(1, 8), st.just(0))
X_F32 = mostly(st.just(F32), st.sampled_from([F64, F16, BF16, I32]))
REAL = mostly(st.floats(-10, 10), st.sampled_from(SPECIAL_DOUBLES))


def is_nhwc(fmt) -> bool:
    return fmt in ("nhwc", "NHWC", 1)


@st.composite
def image_op(draw, x_dtypes=X_F32, shift=True):
    """normalize_l2 / layer_norm_* / channel_norm arguments."""
    size, fmt, c = draw(SIZES), draw(FORMAT_ARGS), draw(CHANNELS)
    args = dict(
        x=draw(image(size, c, is_nhwc(fmt), draw(x_dtypes))), scale=draw(per_channel(c)), eps=draw(EPS), format=fmt
    )
    if shift:
        args["shift"] = draw(per_channel(c))
    return args


@st.composite
def normalize_l2_args(draw):
    args = draw(image_op(shift=False))
    args["across_spatial"] = draw(st.one_of(st.none(), st.booleans()))
    return args


@st.composite
def channel_sum_args(draw):
    size, fmt = draw(SIZES), draw(FORMAT_ARGS)
    dtype = draw(mostly(st.sampled_from([BF16, BF16, BITS]), st.just(F32)))
    return dict(x=draw(image(size, draw(CHANNELS), is_nhwc(fmt), dtype)), format=fmt)


@st.composite
def eltwise_args(draw):
    size = draw(SIZES)
    count = draw(mostly(st.integers(2, 4), st.integers(0, 1)))
    shape = draw(plain_shape(size))
    inputs = []
    for _ in range(count):
        own = draw(mostly(st.just(shape), plain_shape("tiny"), 20))
        inputs.append(draw(array(own, draw(mostly(st.just(F32), X_F32, 20)))))
    op = draw(st.sampled_from(["product", "sum", "max", "min", "SUM", 0, 1, 2, 3]))
    weights = draw(
        st.one_of(st.none(), mostly(st.lists(REAL, min_size=count, max_size=count), st.lists(REAL, max_size=5)))
    )
    return dict(inputs=inputs, op=op, weights=weights)


@st.composite
def lrn_args(draw):
    size, fmt, c = draw(SIZES), draw(FORMAT_ARGS), draw(CHANNELS)
    half = draw(mostly(st.integers(0, 12), st.sampled_from([-1, -2, 2**31, 2**62, -(2**63)])))
    k = draw(
        mostly(
            st.tuples(st.floats(0.5, 2), st.floats(0, 1e-3), st.floats(-1, 1)), st.lists(REAL, min_size=2, max_size=4)
        )
    )
    return dict(x=draw(image(size, c, is_nhwc(fmt), draw(X_F32))), half=half, k=list(k), format=fmt)


@st.composite
def shuffle_args(draw):
    size, fmt = draw(SIZES), draw(FORMAT_ARGS)
    nhwc = is_nhwc(fmt)
    c0 = draw(mostly(st.sampled_from([0, 2, 4, 6]), st.sampled_from([1, 3])))
    c1 = draw(st.one_of(st.just(c0), mostly(st.sampled_from([0, 2, 4, 6, 8]), st.just(5))))
    x0 = draw(image(size, c0, nhwc, draw(X_F32)))
    shape = list(x0.shape)
    shape[-1 if nhwc else 1] = c1
    shape[0] += draw(mostly(st.just(0), st.just(1)))  # another batch size
    x1 = draw(array(tuple(shape), F32))
    channels = draw(
        mostly(
            st.one_of(st.none(), st.integers(0, c0).map(lambda a: [2 * a, 2 * (c0 - a)])),
            st.lists(st.integers(-2, 10), min_size=1, max_size=3),
        )
    )
    return dict(
        x0=x0, x1=x1, type=draw(st.sampled_from(["split", "interleave", "SPLIT", 0, 1])), format=fmt, channels=channels
    )


@st.composite
def softmax_args(draw):
    size = draw(SIZES)
    shape = draw(plain_shape(size, 0, 4))
    dtype = draw(mostly(st.sampled_from([F32, F32, BF16, BITS]), st.just(F64)))
    return dict(x=draw(array(shape, dtype)), axis=draw(st.one_of(st.none(), st.integers(-5, 4))))


@st.composite
def tiled_scale_args(draw):
    size, fmt, c = draw(SIZES), draw(FORMAT_ARGS), draw(CHANNELS)
    nhwc = is_nhwc(fmt)
    x = draw(image(size, c, nhwc, draw(X_F32), rank=draw(st.sampled_from([4, 4, 4, 3]))))
    h, w = (x.shape[1], x.shape[2]) if nhwc and x.ndim == 4 else (x.shape[-2], x.shape[-1])
    ver = (w, c) if nhwc else (c, w)
    hor = (h, c) if nhwc else (c, h)
    if not draw(st.integers(0, 9)):
        ver = (ver[0] + 1, ver[1])
    return dict(
        x=x, ver=draw(array(ver, draw(st.sampled_from([F32, F32, F64])))), hor=draw(array(hor, F32)), format=fmt
    )


@st.composite
def unary_args(draw):
    size = draw(SIZES)
    x = draw(array(draw(plain_shape(size)), draw(X_F32)))
    return dict(x=x, op=draw(st.sampled_from([*tn.UNARY_OPS, "EXP", *range(17)])))


@st.composite
def normalize_args(draw):
    size = draw(SIZES)
    shape = draw(plain_shape(size, 1, 4))
    rank = len(shape)
    x = draw(array(shape, draw(mostly(st.sampled_from([F32, F32, F32, F16, BF16, BITS]), st.just(F64)))))
    axes = draw(
        mostly(
            st.one_of(
                st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank),
                st.integers(1, 2**rank - 1),
            ),
            st.lists(st.integers(-6, 6), min_size=1, max_size=4),
        )
    )
    groups = draw(mostly(st.one_of(st.none(), st.just(1), st.just(shape[1] if rank > 1 else 1)), st.integers(0, 5)))

    def parameter():  # None, broadcastable to x (or per group), or of another shape
        kind = draw(st.sampled_from(["none", "none", "broadcast", "broadcast", "group", "other"]))
        if kind == "none":
            return None
        if kind == "other":
            return draw(array(draw(plain_shape("tiny", 1, 3)), F32))
        if kind == "group" and rank > 1 and groups:
            pshape = tuple(groups if i == 1 else 1 for i in range(rank))
        else:
            pshape = tuple(n if draw(st.booleans()) else 1 for n in shape)
        return draw(array(pshape, draw(st.sampled_from([F32, F32, F16, BF16, F64]))))

    activation = draw(
        st.one_of(
            st.none(),
            st.sampled_from(list(tn.ACTIVATIONS)),
            st.tuples(st.sampled_from(list(tn.ACTIVATIONS)), st.lists(REAL, max_size=2)).map(lambda t: (t[0], *t[1])),
        )
    )
    return dict(
        x=x,
        scale=parameter(),
        bias=parameter(),
        axes=axes,
        num_groups=groups,
        eps=draw(EPS),
        normalize_variance=draw(st.one_of(st.none(), st.booleans())),
        activation=activation,
        compute_dtype=draw(
            mostly(st.sampled_from([None, None, "float32", "fp32", np.float32]), st.sampled_from(["float16", "int8"]))
        ),
    )


@st.composite
def qip_params(draw, n: int) -> dict:
    """b_scale, scales, zero points and bias of a quantized inner product of N columns."""
    # Six parameters that must all be right for a call to succeed: each wrong 1 time in 20
    scale = mostly(st.sampled_from([0.05, 0.5, 0.01, 1.0, 0.002]), st.sampled_from([*SPECIAL_DOUBLES, None]), 20)
    zero = mostly(st.integers(0, 255), st.sampled_from([-1, 256, 2**62, None]), 20)
    b_scale = (
        draw(array((n,), F32))
        if not draw(st.integers(0, 19))
        else np.random.default_rng(draw(st.integers(0, 2**32 - 1))).uniform(0, 0.05, n).astype(np.float32)
    )
    if not draw(st.integers(0, 19)):
        b_scale = b_scale[:-1]
    bias = draw(st.one_of(st.none(), mostly(st.just("small"), st.just("huge"))))
    if bias is not None:
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        bias = (
            rng.integers(-2000, 2000, n, dtype=np.int32)
            if bias == "small"
            else rng.integers(-(2**40), 2**40, n + draw(st.integers(-1, 1)), dtype=np.int64)
        )
    return dict(
        b_scale=b_scale,
        a_scale=draw(scale),
        a_zero=draw(zero),
        c_scale=draw(scale),
        c_zero=draw(zero),
        bias=bias,
        algorithm=draw(mostly(st.none(), st.sampled_from(["scalar", "avx2", "AVX512-VNNI", "amx", "fastest"]), 5)),
    )


@st.composite
def qip_b(draw, trans_b: bool | None):
    """(b, n, k): int8 (K, N), or (N, K) with trans_b; now and then empty or another dtype."""
    k = draw(mostly(st.integers(1, 40), st.sampled_from([0, 600, 2048])))
    n = draw(mostly(st.integers(1, 24), st.integers(300, 600)))
    dtype = draw(mostly(st.just(I8), st.sampled_from([U8, I32, F32]), 20))
    return draw(array((n, k) if trans_b else (k, n), dtype)), n, k


@st.composite
def qip_a(draw, k: int, n: int):
    wide = n >= 300
    m = draw(
        st.one_of(st.integers(0, 6), st.integers(1, 40), st.integers(1500, 3000) if wide else st.integers(200, 3000))
    )
    m = min(m, 1_200_000 // max(k, 1))  # a stays about the tensor limit
    k_a = draw(mostly(st.just(k), st.integers(0, 41)))
    dtype = draw(mostly(st.just(U8), st.sampled_from([I8, F32]), 20))
    return draw(array((m, k_a), dtype))


TRANS_B = st.one_of(st.none(), st.booleans())


@st.composite
def quantized_inner_product_args(draw):
    trans_b = draw(TRANS_B)
    b, n, k = draw(qip_b(trans_b))
    return dict(a=draw(qip_a(k, n)), b=b, **draw(qip_params(n)), trans_b=trans_b)


ARGUMENTS = {
    "normalize_l2": normalize_l2_args(),
    "layer_norm_channels": image_op(
        x_dtypes=mostly(st.sampled_from([F32, F32, BF16, BITS]), st.sampled_from([F64, I8]))
    ),
    "layer_norm_spatial": image_op(),
    "channel_norm": image_op(),
    "channel_sum": channel_sum_args(),
    "eltwise": eltwise_args(),
    "lrn_cross_channels": lrn_args(),
    "shuffle": shuffle_args(),
    "softmax": softmax_args(),
    "tiled_scale_2d": tiled_scale_args(),
    "unary": unary_args(),
    "normalize": normalize_args(),
    "quantized_inner_product": quantized_inner_product_args(),
}


def test_every_operation_has_arguments():
    assert sorted(ARGUMENTS) == sorted(wire.OPERATIONS)


# ---------------------------------------------------------------------------------------
# Mutations driven by the protobuf descriptors

ENUM_EXTRA = [-1, 1000, 2**31 - 1, -(2**31)]
DTYPES = st.one_of(st.sampled_from(range(9)), st.sampled_from([9, 42, -1, 2**31 - 1]))
FORMATS = st.one_of(st.sampled_from([0, 1, 2]), st.sampled_from([3, -1, 1000]))
STRINGS = st.one_of(
    st.sampled_from(
        [
            "",
            "float32",
            "FP32",
            "float16",
            "bfloat16",
            "scalar",
            "avx2",
            "amx",
            "x" * 5000,
            "\u00e9\u4e2d\U0001f600",
            "\x00",
            "../../etc/passwd",
        ]
    ),
    st.text(max_size=24),
)
WILD_SHAPES = st.one_of(
    st.lists(st.sampled_from(WILD_DIMS), max_size=5),
    st.lists(st.integers(0, 6), max_size=5),
    st.lists(st.just(1), min_size=33, max_size=40),
)


@st.composite
def payload(draw, length: int, dtype: int):
    if dtype == tensor_pb2.DATA_TYPE_FP32 and length % 4 == 0 and draw(st.booleans()):
        return draw(array((length // 4,), F32)).tobytes()
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1))).bytes(length)


@st.composite
def random_tensor(draw):
    shape = draw(WILD_SHAPES)
    dtype = draw(DTYPES)
    fmt = draw(FORMATS)
    count = math.prod(shape) if shape and min(shape) >= 0 else 1 if not shape else None
    size = None if count is None else count * ITEMSIZE.get(dtype, 4)
    if size is not None and size <= 8192 and draw(st.integers(0, 4)):
        data = draw(payload(size, dtype))
    else:
        data = draw(st.binary(max_size=64))
    return tensor_pb2.Tensor(shape=shape, dtype=dtype, format=fmt, data=data)


def mutate_tensor(draw, t) -> None:
    how = draw(st.sampled_from(["dtype", "shape", "reshape", "format", "data", "values", "replace"]))
    if how == "dtype":
        t.dtype = draw(DTYPES)
    elif how == "shape":
        del t.shape[:]
        t.shape.extend(draw(WILD_SHAPES))
    elif how == "reshape" and t.shape and min(t.shape) >= 0 and math.prod(t.shape) < 2**63:
        shape = list(t.shape)  # same element count, other shape
        count = math.prod(shape)
        new = draw(st.sampled_from([[count], [1, count], shape[::-1], [*shape, 1], [1, *shape], shape[1:] + shape[:1]]))
        del t.shape[:]
        t.shape.extend(new)
    elif how == "format":
        t.format = draw(FORMATS)
    elif how == "data":
        delta = draw(st.one_of(st.integers(-9, -1), st.integers(1, 9), st.just(-len(t.data))))
        t.data = (
            t.data[: len(t.data) + delta] if delta < 0 else t.data + draw(st.binary(min_size=delta, max_size=delta))
        )
    elif how == "values":
        t.data = draw(payload(len(t.data), t.dtype))
    else:
        t.CopyFrom(draw(random_tensor()))


def scalar_value(draw, f):
    if f.enum_type is not None:
        return draw(st.one_of(st.sampled_from([v.number for v in f.enum_type.values]), st.sampled_from(ENUM_EXTRA)))
    if f.type == f.TYPE_DOUBLE:
        return draw(st.one_of(st.sampled_from(SPECIAL_DOUBLES), st.floats(allow_nan=True, allow_infinity=True)))
    if f.type == f.TYPE_INT64:
        return draw(st.one_of(st.sampled_from(SPECIAL_INTS), st.integers(-(2**63), 2**63 - 1)))
    if f.type == f.TYPE_INT32:
        return draw(st.one_of(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)]), st.integers(-(2**31), 2**31 - 1)))
    if f.type == f.TYPE_BOOL:
        return draw(st.booleans())
    if f.type == f.TYPE_STRING:
        return draw(STRINGS)
    raise AssertionError(f"no generator for field {f.full_name} of type {f.type}")


def mutate_field(draw, message, f) -> None:
    """Change one field of a message, whatever its kind, to a random (valid or not) value."""
    if is_tensor(f) and f.is_repeated:
        items = getattr(message, f.name)
        how = draw(st.sampled_from(["append", "duplicate", "delete", "one", "clear"]))
        if how == "append" or not items:
            items.add().CopyFrom(draw(random_tensor()))
        elif how == "duplicate":
            items.add().CopyFrom(items[draw(st.integers(0, len(items) - 1))])
        elif how == "delete":
            del items[draw(st.integers(0, len(items) - 1))]
        elif how == "one":
            mutate_tensor(draw, items[draw(st.integers(0, len(items) - 1))])
        else:
            message.ClearField(f.name)
    elif is_tensor(f):
        how = draw(st.sampled_from(["mutate", "mutate", "mutate", "clear", "replace"]))
        if how == "mutate" and message.HasField(f.name):
            mutate_tensor(draw, getattr(message, f.name))
        elif how == "clear":
            message.ClearField(f.name)
        else:
            getattr(message, f.name).CopyFrom(draw(random_tensor()))
    elif f.message_type is not None:  # a nested message (normalize's activation)
        if draw(st.integers(0, 3)) == 0:
            message.ClearField(f.name)
        else:
            nested = getattr(message, f.name)
            nested.SetInParent()
            for g in nested.DESCRIPTOR.fields:
                if draw(st.booleans()):
                    mutate_field(draw, nested, g)
    elif f.is_repeated:
        values = getattr(message, f.name)
        del values[:]
        values.extend(scalar_value(draw, f) for _ in range(draw(st.integers(0, 6))))
    elif f.has_presence and draw(st.integers(0, 3)) == 0:
        message.ClearField(f.name)
    else:
        setattr(message, f.name, scalar_value(draw, f))


def mutate(draw, message_class, raw: bytes) -> bytes:
    """1 to 3 field mutations of a serialized request; now and then all fields of an empty
    message set from scratch."""
    if draw(st.integers(0, 9)) == 0:
        message = message_class()
        for f in message.DESCRIPTOR.fields:
            if draw(st.booleans()):
                mutate_field(draw, message, f)
    else:
        message = message_class.FromString(raw)
        fields = list(message.DESCRIPTOR.fields)
        for _ in range(draw(st.integers(1, 3)) if fields else 0):
            mutate_field(draw, message, draw(st.sampled_from(fields)))
    return message.SerializeToString()


AUTH = mostly(st.just(f"Bearer {TOKEN}"), st.sampled_from(AUTH_HEADERS))


def unauthenticated(answer: Answer, auth: str | None) -> bool:
    """Whether `auth` is no valid credential, the answer then checked: such a call ends
    UNAUTHENTICATED whatever its request bytes."""
    if authorized(auth):
        return False
    check(answer, Expect(UNAUTHENTICATED))
    return True


def encode(op: wire.Operation, args: dict) -> wire.Request:
    try:
        return wire.build_request(op, args)
    except codec.WireError:  # arguments the client refuses to send: nothing to test here
        reject()


# ---------------------------------------------------------------------------------------
# 1. Random and mutated requests of every stateless operation


@pytest.mark.long
def test_random_requests_of_every_operation(campaign):
    @fuzz_settings(BUDGET["requests"])
    @given(data=st.data())
    def run(data):
        name = data.draw(st.sampled_from(sorted(wire.OPERATIONS)), label="operation")
        op, fn = wire.OPERATIONS[name], getattr(tn, name)
        args = data.draw(ARGUMENTS[name], label="arguments")
        request = encode(op, args)
        raw = request.data
        mutated = data.draw(st.integers(0, 9), label="mutate") < 4
        if mutated:
            raw = mutate(data.draw, op.request_class, raw)
        auth = data.draw(AUTH, label="authorization")
        answer = campaign.call("requests", op.rpc, raw, auth)
        if unauthenticated(answer, auth):
            return
        expect = predict(op, raw, fn, None if mutated else args)
        check(answer, expect, lambda body: wire.decode_response(op, body, request.bf16_bits and not mutated))

    run()
    seen = campaign.codes("requests")
    print(
        f"\nrequests: {dict(seen)}; OK / INVALID_ARGUMENT by operation: "
        + ", ".join(
            f"{op.name} {campaign.by_rpc[op.rpc, 'OK']}/{campaign.by_rpc[op.rpc, 'INVALID_ARGUMENT']}"
            for op in wire.OPERATIONS.values()
        )
    )
    assert seen["OK"] >= 5 and seen["INVALID_ARGUMENT"] >= 5 and seen["UNAUTHENTICATED"] >= 1, seen
    if BUDGET["requests"] >= 1000:  # enough examples for every operation to succeed and fail
        for op in wire.OPERATIONS.values():
            assert campaign.by_rpc[op.rpc, "OK"] and campaign.by_rpc[op.rpc, "INVALID_ARGUMENT"], (
                op.rpc,
                campaign.by_rpc,
            )


# ---------------------------------------------------------------------------------------
# 2. Sessions: a state machine with a model of the server's store


@st.composite
def session_arguments(draw):
    trans_b = draw(TRANS_B)
    b, n, _ = draw(qip_b(trans_b))
    return dict(
        b=b,
        **draw(qip_params(n)),
        trans_b=trans_b,
        max_m=draw(mostly(st.one_of(st.none(), st.integers(1, 64)), st.sampled_from([0, -1, 2**40, 2**40 + 1, 2**62]))),
    )


@st.composite
def valid_session_arguments(draw):
    trans_b = draw(TRANS_B)
    k, n = draw(st.integers(1, 64)), draw(st.integers(1, 32))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return dict(
        b=rng.integers(-128, 128, (n, k) if trans_b else (k, n), dtype=np.int8),
        trans_b=trans_b,
        b_scale=rng.uniform(0, 0.05, n).astype(np.float32),
        a_scale=draw(st.sampled_from([0.05, 0.01, 0.5])),
        a_zero=draw(st.integers(0, 255)),
        c_scale=draw(st.sampled_from([0.5, 0.1, 1.0])),
        c_zero=draw(st.integers(0, 255)),
        max_m=draw(st.one_of(st.none(), st.integers(1, 64))),
        bias=draw(st.one_of(st.none(), st.just(rng.integers(-2000, 2000, n, dtype=np.int32)))),
    )


# Headers of callers other than the campaign's: another caller, or none at all
INTRUDERS = [h for h in AUTH_HEADERS if not (authorized(h) and h[7:].strip() == TOKEN)]


class SessionCalls(RuleBasedStateMachine):
    """Create, forward, describe, list and release sessions, valid and mutated requests,
    on known, released and made-up ids. The model: the live sessions in least recently
    used order (the server evicts the least recently used beyond MAX_SESSIONS), each
    with its in-process twin and its forward count."""

    campaign: Campaign = None  # set by the test

    def __init__(self):
        super().__init__()
        self.live: OrderedDict[str, dict] = OrderedDict()
        self.gone: list[str] = []
        # Each run starts from an empty store, even after a failed run left sessions behind.
        listed = self.campaign.call("setup", "ListSessions", b"")
        for s in pb.ListSessionsResponse.FromString(listed.data).sessions:
            self.campaign.call(
                "setup", "ReleaseSession", pb.ReleaseSessionRequest(session_id=s.session_id).SerializeToString()
            )

    def call(self, rpc: str, raw: bytes) -> Answer:
        return self.campaign.call("sessions", rpc, raw)

    def maybe_mutated(self, data, message_class, raw: bytes) -> tuple[bytes, bool]:
        if data.draw(st.integers(0, 9), label="mutate") < 3:
            return mutate(data.draw, message_class, raw), True
        return raw, False

    def drop(self, sid: str) -> None:
        context = self.live.pop(sid)["context"]
        if context is not None:
            context.close()
        self.gone.append(sid)

    def session_id(self, data) -> str:
        """A live session's id four times in five (when there is one), else a released,
        evicted or made-up one."""
        others = [st.text(max_size=30), st.sampled_from(["", "0" * 22, "x" * 5000])]
        if self.gone:
            others.append(st.sampled_from(self.gone))
        ids = st.one_of(*others)
        if self.live:
            ids = mostly(st.sampled_from(list(self.live)), ids, 5)
        return data.draw(ids, label="session_id")

    def touch(self, sid: str) -> dict:
        self.live.move_to_end(sid)
        return self.live[sid]

    @rule(data=st.data())
    def create(self, data):
        self._create(data, session_arguments(), True)

    @rule(data=st.data())
    def create_valid(self, data):
        self._create(data, valid_session_arguments(), False)

    def _create(self, data, arguments, may_mutate: bool):
        op = wire.CREATE_SESSION
        args = data.draw(arguments, label="arguments")
        raw, mutated = encode(op, args).data, False
        if may_mutate:
            raw, mutated = self.maybe_mutated(data, op.request_class, raw)
        answer = self.call(op.rpc, raw)
        expect = predict(op, raw, tn.QuantizedInnerProduct, None if mutated else args)
        context = expect.result if expect.code is OK else None
        if answer.code is OK:  # in the model before anything is checked: teardown releases it
            info = pb.SessionInfo.FromString(answer.data)
            if len(self.live) >= MAX_SESSIONS:
                self.drop(next(iter(self.live)))  # evicted: the least recently used
            self.live[info.session_id] = {"context": context, "forwards": 0}
        if context is None:
            check(answer, expect)
            return
        assert answer.code is OK, f"the server answered {answer.code.name} ({answer.details}); in-process: OK"
        assert (info.n, info.k, info.max_m, info.internal_buffer_size, info.info) == (
            context.n,
            context.k,
            context.max_m,
            context.state_size,  # a session's memory: its state (parameters and packed B)
            context.info,
        )

    @rule(data=st.data())
    def forward(self, data):
        sid = self.session_id(data)
        for _ in range(data.draw(st.integers(1, 3), label="forwards")):
            self.forward_once(data, sid)

    def forward_once(self, data, sid: str) -> None:
        op = wire.FORWARD_SESSION
        local = self.live.get(sid)
        k, n = (local["context"].k, local["context"].n) if local else (data.draw(st.integers(1, 8)), 8)
        a = data.draw(qip_a(k, n), label="a")
        raw, mutated = self.maybe_mutated(data, op.request_class, encode(op, {"session_id": sid, "a": a}).data)
        answer = self.call(op.rpc, raw)
        try:  # a message that does not parse is refused before the session is looked up
            message = op.request_codec.decode(raw).message if len(raw) <= MAX_MESSAGE else None
        except Exception:
            message = None
        if message is None:
            try:
                decode_arguments(op, raw, skip=("session_id",))
            except Refused as refused:
                check(answer, refused.expect)
                return
        if message is None or message.session_id not in self.live:
            check(answer, Expect(NOT_FOUND, "session_id"))
            return
        # The session is found, so the call uses it (and counts as a forward) before its
        # tensor is checked.
        local = self.touch(message.session_id)
        local["forwards"] += 1
        try:
            message, kwargs = decode_arguments(op, raw, skip=("session_id",))
        except Refused as refused:
            check(answer, refused.expect)
            return
        context = local["context"]
        a = kwargs.get("a")
        expect = result_check(kwargs, context.n) or run_native(context.forward, a)
        check(answer, expect, lambda body: wire.decode_response(op, body))

    @rule(data=st.data())
    def describe(self, data):
        message = pb.DescribeSessionRequest(session_id=self.session_id(data))
        m = data.draw(
            st.one_of(st.none(), st.integers(0, 300), st.sampled_from([-1, 2**40, 2**62, -(2**63)])), label="m"
        )
        if m is not None:
            message.m = m
        raw, _ = self.maybe_mutated(data, pb.DescribeSessionRequest, message.SerializeToString())
        answer = self.call("DescribeSession", raw)
        message = pb.DescribeSessionRequest.FromString(raw)
        if message.session_id not in self.live:
            check(answer, Expect(NOT_FOUND, "session_id"))
            return
        local = self.touch(message.session_id)
        context = local["context"]
        m = message.m if message.HasField("m") else context.max_m
        expect = run_native(context.external_buffer_size_for, m)
        check(answer, expect)
        if expect.code is OK:
            info = pb.SessionInfo.FromString(answer.data)
            assert (
                info.session_id,
                info.n,
                info.k,
                info.m,
                info.external_buffer_size,
                info.forward_count,
                info.max_m,
            ) == (message.session_id, context.n, context.k, m, expect.result, local["forwards"], context.max_m)

    @rule(data=st.data())
    def release(self, data):
        message = pb.ReleaseSessionRequest(session_id=self.session_id(data))
        raw, _ = self.maybe_mutated(data, pb.ReleaseSessionRequest, message.SerializeToString())
        answer = self.call("ReleaseSession", raw)
        sid = pb.ReleaseSessionRequest.FromString(raw).session_id
        if sid in self.live:
            assert answer.code is OK and answer.data == b"", answer
            self.drop(sid)
        else:
            check(answer, Expect(NOT_FOUND, "session_id"))

    @rule(data=st.data())
    def intrude(self, data):
        """Another caller (the other token), or one without a valid token, on the sessions:
        to the former they do not exist, the latter is refused; they stay as they were (the
        next listing checks their order and forward counts)."""
        auth = data.draw(st.sampled_from(INTRUDERS), label="authorization")
        rpc = data.draw(
            st.sampled_from(["QuantizedInnerProductForward", "DescribeSession", "ReleaseSession", "ListSessions"]),
            label="rpc",
        )
        sid = self.session_id(data)
        if rpc == "QuantizedInnerProductForward":
            context = self.live[sid]["context"] if sid in self.live else None
            k = context.k if context is not None else 8
            raw = encode(wire.FORWARD_SESSION, {"session_id": sid, "a": np.ones((1, k), np.uint8)}).data
        elif rpc == "DescribeSession":
            raw = pb.DescribeSessionRequest(session_id=sid).SerializeToString()
        elif rpc == "ReleaseSession":
            raw = pb.ReleaseSessionRequest(session_id=sid).SerializeToString()
        else:
            raw = b""
        answer = self.campaign.call("sessions", rpc, raw, auth)
        if unauthenticated(answer, auth):
            return
        if rpc == "ListSessions":
            assert answer.code is OK and pb.ListSessionsResponse.FromString(answer.data).sessions == [], answer
        else:
            check(answer, Expect(NOT_FOUND, "session_id"))

    @rule(data=st.data())
    def look(self, data):
        if data.draw(st.booleans(), label="list"):
            self.list_sessions()
        else:
            self.server_info(data)

    def list_sessions(self):
        answer = self.call("ListSessions", b"")
        assert answer.code is OK, answer
        listed = pb.ListSessionsResponse.FromString(answer.data).sessions
        assert [s.session_id for s in listed] == list(self.live)  # least recently used first
        for s in listed:
            local = self.live[s.session_id]
            assert (s.n, s.k, s.forward_count) == (local["context"].n, local["context"].k, local["forwards"])

    def server_info(self, data):
        raw = data.draw(
            st.sampled_from([b"", pb.ListSessionsRequest().SerializeToString(), b"\x08\x01", b"\x12\x03abc"]),
            label="request",
        )  # unknown fields are skipped
        answer = self.call("GetServerInfo", raw)
        assert answer.code is OK, answer
        limits = pb.ServerInfo.FromString(answer.data).limits
        assert (limits.max_message_bytes, limits.max_tensor_bytes, limits.max_sessions) == (
            MAX_MESSAGE,
            MAX_TENSOR,
            MAX_SESSIONS,
        )

    def teardown(self):
        if self.campaign.death:
            return
        for sid in list(self.live):
            answer = self.call("ReleaseSession", pb.ReleaseSessionRequest(session_id=sid).SerializeToString())
            assert answer.code is OK, answer
            self.drop(sid)


@pytest.mark.long
def test_random_session_calls(campaign):
    SessionCalls.campaign = campaign
    run_state_machine_as_test(
        SessionCalls, settings=fuzz_settings(BUDGET["sessions"], stateful_step_count=SESSION_STEPS)
    )
    seen = campaign.codes("sessions")
    print(f"\nsessions: {dict(seen)}")
    assert seen["OK"] >= 5 and seen["NOT_FOUND"] >= 1 and seen["INVALID_ARGUMENT"] >= 1, seen
    assert seen["UNAUTHENTICATED"] >= 1, seen


# ---------------------------------------------------------------------------------------
# 3. Garbage, truncated, flipped, duplicated and spliced bytes for every RPC

RPCS = sorted(wire.SERVICE.methods_by_name)
OPERATION_OF_RPC = {op.rpc: op for op in wire.OPERATIONS.values()}
CLASSIC_GARBAGE = [
    b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a length of 2**64 - 1
    b"\x0a\x80\x80\x80\x80\x10",  # a length of 4 GiB, no bytes
    b"\x08" + b"\xff" * 11,  # an 11-byte varint
    b"\x08",  # a truncated varint
    b"\x0a\x05abc",  # a field shorter than its length
    b"\x0b" * 3000 + b"\x0c" * 3000,  # 3000 nested groups
    b"\x0e\x00",  # wire type 6
    b"\x00\x00",  # field number 0
    b"\xff" * 64,
    b"\x0a\x02\x0a\x00" * 5000,  # 5000 empty tensors / strings
    bytes(40_000),  # large (codec path), field number 0
    b"\x0a\x06\x0a\x04\xff\xff\xff\xff" + bytes(40_000),  # negative packed dimension, then junk
    b"\x7a\x10" + bytes(16) + b"\x0a" + b"\x80" * 40_000,  # a varint that never ends, large
]


@st.composite
def valid_request(draw, rpc: str) -> bytes:
    if rpc in OPERATION_OF_RPC:
        op = OPERATION_OF_RPC[rpc]
        return encode(op, draw(ARGUMENTS[op.name])).data
    if rpc == "CreateQuantizedInnerProduct":
        return encode(wire.CREATE_SESSION, draw(session_arguments())).data
    if rpc == "QuantizedInnerProductForward":
        return encode(wire.FORWARD_SESSION, {"session_id": draw(STRINGS), "a": draw(qip_a(8, 8))}).data
    if rpc == "DescribeSession":
        return pb.DescribeSessionRequest(session_id=draw(STRINGS), m=draw(st.integers(0, 9))).SerializeToString()
    if rpc == "ReleaseSession":
        return pb.ReleaseSessionRequest(session_id=draw(STRINGS)).SerializeToString()
    return b""


@st.composite
def garbled(draw, raw: bytes) -> bytes:
    how = draw(
        st.sampled_from(
            ["random", "random-large", "truncate", "flip", "flip-head", "duplicate", "splice", "insert", "classic"]
        )
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if how == "random":
        return rng.bytes(draw(st.integers(0, 300)))
    if how == "random-large":
        return rng.bytes(draw(st.integers(33_000, 200_000)))
    if how == "classic":
        return draw(st.sampled_from(CLASSIC_GARBAGE))
    if not raw:
        return rng.bytes(draw(st.integers(1, 40)))
    if how == "truncate":
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if how in ("flip", "flip-head"):
        out = bytearray(raw)
        span = min(len(out), 96) if how == "flip-head" else len(out)
        for _ in range(draw(st.integers(1, 8))):
            out[int(rng.integers(span))] ^= 1 << int(rng.integers(8))
        return bytes(out)
    if how == "duplicate":
        return raw + raw  # protobuf merges: repeated fields doubled, singular ones merged
    i, j = sorted(int(v) for v in rng.integers(0, len(raw) + 1, 2))
    if how == "splice":
        return raw[:j] + raw[i:]  # a stretch repeated
    return raw[:i] + rng.bytes(draw(st.integers(1, 16))) + raw[i:]


@pytest.mark.long
def test_garbage_and_mutated_bytes(campaign):
    @fuzz_settings(BUDGET["garbage"])
    @given(data=st.data())
    def run(data):
        rpc = data.draw(st.sampled_from(RPCS), label="rpc")
        raw = data.draw(garbled(data.draw(valid_request(rpc), label="valid")), label="bytes")
        auth = data.draw(AUTH, label="authorization")
        answer = campaign.call("garbage", rpc, raw, auth)
        op = OPERATION_OF_RPC.get(rpc)
        if unauthenticated(answer, auth):
            pass
        elif op is not None:
            check(answer, predict(op, raw, getattr(tn, op.name)), lambda body: wire.decode_response(op, body))
        elif answer.code is OK:  # an answer the client can read; a session made is released
            response = wire.message_class(wire.SERVICE.methods_by_name[rpc].output_type)
            if rpc == "QuantizedInnerProductForward":
                wire.decode_response(wire.FORWARD_SESSION, answer.data)
            else:
                parsed = response.FromString(answer.data)
                if rpc == "CreateQuantizedInnerProduct":
                    release = pb.ReleaseSessionRequest(session_id=parsed.session_id).SerializeToString()
                    assert campaign.call("garbage", "ReleaseSession", release, auth).code is OK

    run()
    seen = campaign.codes("garbage")
    print(f"\ngarbage: {dict(seen)}")
    assert seen["INVALID_ARGUMENT"] >= 5, seen


# ---------------------------------------------------------------------------------------
# After the campaign


@pytest.mark.long
def test_the_server_survived_the_campaign(campaign, capsys):
    server = campaign.server
    peak = resident_bytes(server.proc.pid, "VmHWM")
    with capsys.disabled():  # shown without -s too
        print(
            f"\n{campaign.summary()}; server peak memory {peak / 2**20:.0f} MiB "
            f"(idle {campaign.idle_peak / 2**20:.0f} MiB)"
        )
    assert campaign.death is None, campaign.death
    assert server.proc.poll() is None, "the server process exited"
    health = health_pb2_grpc.HealthStub(campaign.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
    assert pb.ListSessionsResponse.FromString(campaign.call("final", "ListSessions", b"").data).sessions == []
    text = server.metrics_text()
    assert metric_value(text, "tensorops_sessions_active") == 0
    unexpected = [
        line
        for line in text.splitlines()
        if line.startswith("tensorops_errors_total")
        and any(f'code="{c}"' in line for c in ("INTERNAL", "UNKNOWN", "DEADLINE_EXCEEDED", "CANCELLED"))
    ]
    assert not unexpected, unexpected
    errors = [e for e in server.events() if e.get("level") in ("error", "critical")]
    assert not errors, errors[:3]
    # Requests of at most 4 MiB, results of at most 1 MiB, 4 workers: whatever the shapes
    # claim, no call may make the server allocate more than a few times that (a result
    # sized by the dimensions of an empty tensor took hundreds of MiB)
    grown = peak - campaign.idle_peak
    assert grown < PEAK_GROWTH_BOUND, f"the server's memory peaked {grown / 2**20:.0f} MiB above its idle peak"
