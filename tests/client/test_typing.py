"""The client's static types, as a user's type checker sees them.

mypy (with the project's configuration) checks small programs written here: every result
of the three clients and their sessions has a precise type (an ndarray of a known dtype,
an awaitable of one for the asyncio client, a session, a typed dict), never Any; wrong
arguments (a misspelt format, an axis given by name, a str for a number) are errors
naming the argument, while the calls the API documents are accepted. The package itself
must check without errors on the way (it is imported from the programs). The closed sets
of names declared for the type checker are compared with the protocol's own.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

import tensorops_native
from tensorops import _client, _operations
from tensorops.protocol import dtypes
from tensorops.v1 import tensorops_pb2

ROOT = Path(__file__).resolve().parents[2]

# Keyword arguments of a quantized inner product (B has 5 columns).
QIP = "b_scale=np.ones(5, np.float32), a_scale=0.5, a_zero=3, c_scale=0.25, c_zero=7"
PRELUDE = f"""\
import numpy as np
import numpy.typing as npt
import tensorops
import tensorops.aio

x: npt.NDArray[np.float32] = np.zeros((1, 4, 2, 2), np.float32)
bits: npt.NDArray[np.uint16] = np.zeros((1, 4, 2, 2), np.uint16)
wide: npt.NDArray[np.float64] = np.zeros(3)
a: npt.NDArray[np.uint8] = np.zeros((2, 3), np.uint8)
b: npt.NDArray[np.int8] = np.zeros((3, 5), np.int8)
client = tensorops.Client("localhost:50051")
local = tensorops.LocalClient()
aio = tensorops.aio.Client("localhost:50051")
session = client.quantized_inner_product(b, {QIP})
local_session = local.QuantizedInnerProduct(b, {QIP})


async def main() -> None:
"""
FIRST_LINE = PRELUDE.count("\n") + 1  # of main's body, where the checked lines go

_ARRAY = "numpy.ndarray[tuple[int, ...], numpy.dtype[{}]]"
F32 = _ARRAY.format("numpy.floating[numpy._typing._nbit_base._32Bit]")
FLOATS = _ARRAY.format(
    "numpy.floating[numpy._typing._nbit_base._32Bit]"
    " | numpy.floating[numpy._typing._nbit_base._16Bit]"
    " | numpy.unsignedinteger[numpy._typing._nbit_base._16Bit] | numpy.generic[float]"
)
U8 = _ARRAY.format("numpy.unsignedinteger[numpy._typing._nbit_base._8Bit]")

# (expression, {c} standing for the client, and the type the blocking clients give: the
# asyncio client gives an awaitable of it).
OPERATION_RESULTS = [
    ("{c}.normalize_l2(x, [1.0] * 4, eps=1e-6, across_spatial=True)", F32),
    ("{c}.layer_norm_channels(x, np.ones(4), np.zeros(4), format='nhwc')", FLOATS),
    ("{c}.layer_norm_spatial(x, np.ones(4), np.zeros(4))", F32),
    ("{c}.channel_norm(x, np.ones(4), np.zeros(4), eps=1)", F32),
    ("{c}.channel_norm(x, np.ones(4), np.zeros(4), eps=np.float32(1e-3), format='nhwc')", F32),
    ("{c}.channel_sum(bits, format='nchw')", F32),
    ("{c}.eltwise([x, x], 'sum', [0.5, 2.0])", F32),
    ("{c}.eltwise([x, x, x], 1)", F32),
    ("{c}.lrn_cross_channels(x, 2, (1.0, 1e-4, -0.75))", F32),
    ("{c}.shuffle(x, x, type='interleave', channels=(4, 4))", f"tuple[{F32}, {F32}]"),
    ("{c}.softmax(x, 1)", FLOATS),
    ("{c}.softmax(x, np.int64(1))", FLOATS),
    ("{c}.softmax(bits, axis=-1, timeout=5, metadata={{'x-trace': 'a'}})", FLOATS),
    ("{c}.tiled_scale_2d(x, np.ones((4, 2)), np.ones((4, 2)))", F32),
    ("{c}.unary(x, 'rsqrt', out=np.empty_like(x))", F32),
    ("{c}.normalize(x, axes=0b1100, num_groups=2, activation=('leaky_relu', 0.1), compute_dtype='float32')", FLOATS),
    (
        "{c}.normalize(x, axes=(np.int64(1),), activation=('linear', 2, np.float32(0.5)), compute_dtype=np.float32)",
        FLOATS,
    ),
    ("{c}.normalize(x, np.ones(4), None, axes=[1, 2], activation='gelu', metadata=[('k-bin', b'v')])", FLOATS),
    ("{c}.quantized_inner_product(a, b, {q})", U8),
    ("{c}.quantized_inner_product(a, b, {q}, bias=np.zeros(5, np.int32), algorithm='scalar')", U8),
]
OTHER_RESULTS = [
    ("client.quantized_inner_product(b, {q}, max_m=4)", "tensorops._client.QuantizedInnerProductSession"),
    ("client.QuantizedInnerProduct(b, {q})", "tensorops._client.QuantizedInnerProductSession"),
    ("session.forward(a)", U8),
    ("session.describe()['idle_seconds']", "float"),
    ("session.external_buffer_size_for(8)", "int"),
    ("session.info", "str"),
    ("client.info()['limits']['max_sessions']", "int"),
    ("client.info()['kernels']", "dict[str, str]"),
    ("client.list_sessions()[0]['session_id']", "str"),
    ("client.shared_array((2, 3))", F32),
    ("client.shared_array(8, np.uint8)", U8),
    ("aio.shared_array([4], np.dtype(np.float32))", F32),
    ("local.QuantizedInnerProduct(b, {q})", "tensorops._local.LocalSession"),
    ("local_session.forward(a)", U8),
    ("local_session.internal_buffer_size", "int"),
    ("local.info()", "dict[str, object]"),
    ("aio.quantized_inner_product(b, {q})", "typing.Awaitable[tensorops.aio.QuantizedInnerProductSession]"),
    ("(await aio.info())['cpu_features']", "list[str]"),
    ("await (await aio.QuantizedInnerProduct(b, {q})).forward(a)", U8),
    ("await (await aio.quantized_inner_product(b, {q})).external_buffer_size_for(2)", "int"),
    ("(await aio.list_sessions())[0]['forward_count']", "int"),
]

# Calls that must be errors, and how mypy's error names the argument.
WRONG_CALLS = [
    ("client.softmax(x, axis='last')", 'Argument "axis"'),
    ("aio.softmax(x, axis='last')", 'Argument "axis"'),
    ("local.softmax(x, 'last')", "Argument 2"),
    ("client.layer_norm_channels(x, [1.0], [0.0], format='xyz')", 'Argument "format"'),
    ("client.layer_norm_channels(x, [1.0], [0.0], format='NHWC')", 'Argument "format"'),
    ("local.channel_norm(x, [1.0], [0.0], eps='1e-5')", 'Argument "eps"'),
    ("aio.normalize_l2(x, [1.0], eps='tiny')", 'Argument "eps"'),
    ("client.unary(x, 'expo')", "Argument 2"),
    ("client.unary(wide, 'exp')", "Argument 1"),
    ("client.eltwise([x, x], 'mean')", "Argument 2"),
    ("client.shuffle(x, x, type='halves')", 'Argument "type"'),
    ("client.normalize(x, axes=[1], activation='swish')", 'Argument "activation"'),
    ("client.normalize(x, axes=[1], activation=('elu', 'one'))", 'Argument "activation"'),
    ("client.normalize(x, axes='1')", 'Argument "axes"'),
    ("client.quantized_inner_product(a, b, {q}, algorithm='avx3')", "No overload variant"),
    ("client.softmax(x, timeout='5s')", 'Argument "timeout"'),
    ("client.softmax(x, metadata={{'k': 1}})", 'Argument "metadata"'),
    ("client.lrn_cross_channels(x, 2.5, (1.0, 1.0, 1.0))", "Argument 2"),
    ("client.lrn_cross_channels(x, np.float32(2), (1.0, 1.0, 1.0))", "Argument 2"),
    ("client.layer_norm_spatial(x, [1.0], [0.0], eps=None)", 'Argument "eps"'),
    ("session.forward(b)", "Argument 1"),
    ("tensorops.Client('localhost:50051', timeout='5')", 'Argument "timeout"'),
    ("tensorops.aio.Client(load_balancing='random')", 'Argument "load_balancing"'),
    ("tensorops.Client(shared_memory=True, max_attempts=2.5)", 'Argument "max_attempts"'),
]


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, dict[int, list[str]]]:
    """mypy's notes and errors, by file ("reveals.py", "wrong.py" or a module's path)
    and line, for a program revealing the type of every result and one of wrong calls."""
    tmp = tmp_path_factory.mktemp("typing")
    reveals = [expr.format(c=c, q=QIP) for c in ("client", "local", "aio") for expr, _ in OPERATION_RESULTS]
    reveals += [expr.format(q=QIP) for expr, _ in OTHER_RESULTS]
    (tmp / "reveals.py").write_text(PRELUDE + "".join(f"    reveal_type({e})\n" for e in reveals))
    (tmp / "wrong.py").write_text(PRELUDE + "".join(f"    {c.format(q=QIP)}\n" for c, _ in WRONG_CALLS))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp / "cache"),
            "--no-error-summary",
            "--hide-error-context",
            "--show-absolute-path",
            "reveals.py",
            "wrong.py",
        ],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # 1: errors found (the wrong calls); 2: mypy could not run
    assert run.returncode in (0, 1) and "reveals.py" in run.stdout, run.stdout + run.stderr
    found: dict[str, dict[int, list[str]]] = {}
    for line in run.stdout.splitlines():
        match = re.match(r"(.+?):(\d+): (?:note|error): (.*)", line)
        assert match, f"unexpected output from mypy: {line}"
        path, number, message = match.groups()
        name = Path(path).name if Path(path).parent == tmp else path
        found.setdefault(name, {}).setdefault(int(number), []).append(message)
    return found


def test_the_package_checks_cleanly(checked):
    """No error but the wrong calls' (the package's own modules are checked as the
    programs import them), and nothing but the revealed types in the other program."""
    assert set(checked) <= {"reveals.py", "wrong.py"}, checked
    assert all(m.startswith("Revealed type is ") for lines in checked["reveals.py"].values() for m in lines)


def _revealed(checked, index: int) -> str:
    messages = checked["reveals.py"].get(FIRST_LINE + index, [])
    assert len(messages) == 1 and messages[0].startswith('Revealed type is "'), messages
    return messages[0][len('Revealed type is "') : -1]


@pytest.mark.parametrize("client", ["client", "local", "aio"])
@pytest.mark.parametrize(
    "index", range(len(OPERATION_RESULTS)), ids=[expr[4:].split("(")[0] for expr, _ in OPERATION_RESULTS]
)
def test_operation_results(checked, client, index):
    expected = OPERATION_RESULTS[index][1]
    revealed = _revealed(checked, ["client", "local", "aio"].index(client) * len(OPERATION_RESULTS) + index)
    assert revealed == (f"typing.Awaitable[{expected}]" if client == "aio" else expected)
    assert "Any" not in revealed


@pytest.mark.parametrize("index", range(len(OTHER_RESULTS)), ids=[expr for expr, _ in OTHER_RESULTS])
def test_session_and_description_results(checked, index):
    revealed = _revealed(checked, 3 * len(OPERATION_RESULTS) + index)
    assert revealed == OTHER_RESULTS[index][1]


@pytest.mark.parametrize("index", range(len(WRONG_CALLS)), ids=[call for call, _ in WRONG_CALLS])
def test_wrong_arguments_are_errors(checked, index):
    errors = checked.get("wrong.py", {}).get(FIRST_LINE + index, [])
    assert any(WRONG_CALLS[index][1] in e for e in errors), errors


def _wire_names(enum) -> tuple[str, ...]:
    """The Python API's names of a tensorops.v1 enum, in its order (UNSPECIFIED left out)."""
    prefix = enum.values_by_number[0].name[: -len("UNSPECIFIED")]
    return tuple(v.name[len(prefix) :].lower() for v in enum.values if v.number)


@pytest.mark.parametrize(
    "alias,names",
    [
        (_operations.Format, tuple(dtypes.FORMATS)),
        (_operations.EltwiseOp, _wire_names(tensorops_pb2.EltwiseOp.DESCRIPTOR)),
        (_operations.ShuffleType, _wire_names(tensorops_pb2.ShuffleType.DESCRIPTOR)),
        (_operations.UnaryOp, _wire_names(tensorops_pb2.UnaryOp.DESCRIPTOR)),
        (_operations.ActivationName, _wire_names(tensorops_pb2.Activation.DESCRIPTOR)),
        (_operations.Algorithm, tuple(tensorops_native._qip.ALGORITHMS)),
    ],
    ids=["Format", "EltwiseOp", "ShuffleType", "UnaryOp", "ActivationName", "Algorithm"],
)
def test_declared_names_are_the_protocols(alias, names):
    assert typing.get_args(alias) == names


@pytest.mark.parametrize(
    "described,message",
    [
        (_client.SessionInfo, tensorops_pb2.SessionInfo),
        (_client.ServerInfo, tensorops_pb2.ServerInfo),
        (_client.ServerLimits, tensorops_pb2.ServerLimits),
    ],
    ids=["SessionInfo", "ServerInfo", "ServerLimits"],
)
def test_typed_dicts_follow_the_messages(described, message):
    """Every field of the message, with the Python type protobuf gives its values."""
    scalars = {
        FieldDescriptor.TYPE_STRING: str,
        FieldDescriptor.TYPE_DOUBLE: float,
        FieldDescriptor.TYPE_INT64: int,
        FieldDescriptor.TYPE_INT32: int,
    }
    hints = typing.get_type_hints(described)
    assert set(hints) == set(message.DESCRIPTOR.fields_by_name)
    for f in message.DESCRIPTOR.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key, value = (f.message_type.fields_by_name[n] for n in ("key", "value"))
            assert hints[f.name] == dict[scalars[key.type], scalars[value.type]], f.name  # type: ignore[misc]
        elif f.message_type is not None:
            assert set(typing.get_type_hints(hints[f.name])) == set(f.message_type.fields_by_name), f.name
        elif f.is_repeated:
            assert hints[f.name] == list[scalars[f.type]], f.name  # type: ignore[misc]
        else:
            assert hints[f.name] is scalars[f.type], f.name


def test_client_options_are_the_base_clients_keywords():
    """What Client and tensorops.aio.Client pass on to ClientBase is what it takes."""
    keywords = [
        p.name for p in inspect.signature(_client.ClientBase.__init__).parameters.values() if p.kind is p.KEYWORD_ONLY
    ]
    assert list(typing.get_type_hints(_client.ClientOptions)) == keywords
    assert typing.get_args(_client.LoadBalancing) == _client.LOAD_BALANCING_POLICIES
