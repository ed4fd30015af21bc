"""A closed client (after close() or its `with` block) and the sessions and shared arrays
bound to it: every public method raises ClientClosedError ("the client is closed"). gRPC
crashes the process when a method is created on a closed channel, so each scenario runs in
a subprocess (this file run as a script) against a real server, and the test checks that it
exited normally. The methods checked are read from the classes, so a new method is covered
without a change here."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tensorops
import tensorops.aio
from tensorops._local import LocalSession

CLOSED = "the client is closed"
SESSION_CLASSES = {
    "sync": tensorops.QuantizedInnerProductSession,
    "aio": tensorops.aio.QuantizedInnerProductSession,
    "local": LocalSession,
}
CLIENT_CLASSES = {"sync": tensorops.Client, "aio": tensorops.aio.Client, "local": tensorops.LocalClient}
QIP = dict(b_scale=np.full(3, 0.01, np.float32), a_scale=0.05, a_zero=7, c_scale=0.6, c_zero=3)


def public_methods(cls) -> list[str]:
    """Every public method but close (which may be called again: it does nothing)."""
    return sorted(
        name
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_") and callable(value) and name != "close"
    )


def placeholder_arguments(method) -> tuple[list, dict]:
    """Arguments that bind to the method's signature (a closed client refuses them all
    before looking at them)."""
    args, kwargs = [], {}
    for p in inspect.signature(method).parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.VAR_POSITIONAL:
            args.append(np.zeros((2, 3), np.int8))
        elif p.default is p.empty and p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = 1
        elif p.default is p.empty:
            args.append(np.zeros((1, 2, 2, 2), np.float32))
    return args, kwargs


# ---- the scenario, run in a subprocess: `python test_client_closed.py KIND TARGET`


async def outcome(obj, name: str) -> list:
    """[exception class, message, whether it is a ValueError] of calling obj.name with
    placeholder arguments (["returned", "", False] if it did not raise)."""
    method = getattr(obj, name)
    args, kwargs = placeholder_arguments(method)
    return await outcome_of(method, *args, **kwargs)


async def outcome_of(method, *args, **kwargs) -> list:
    try:
        await maybe_await(method(*args, **kwargs))
    except Exception as exc:  # reported to the test
        return [type(exc).__name__, str(exc), isinstance(exc, ValueError)]
    return ["returned", "", False]


async def maybe_await(value):
    return await value if inspect.isawaitable(value) else value


async def scenario(kind: str, target: str) -> dict:
    """Open a client of `kind`, use it (a call, two sessions, a shared array), close it,
    then call everything: {label: {method: outcome}}."""
    a = np.zeros((2, 2), np.uint8)
    b = np.ones((2, 3), np.int8)
    report = {}
    for balancing in ("pick_first", "round_robin") if kind != "local" else ("in-process",):
        if kind == "local":
            client = tensorops.LocalClient()
        else:
            client = CLIENT_CLASSES[kind](target, timeout=30, shared_memory=True, load_balancing=balancing)
        x = np.ones((1, 3, 2, 2), np.float32)
        await maybe_await(client.softmax(x))
        if kind != "local":
            x = client.shared_array((1, 3, 2, 2))
            x[...] = 1
        first = await maybe_await(client.quantized_inner_product(b, **QIP))
        second = await maybe_await(client.QuantizedInnerProduct(b, **QIP))
        assert (await maybe_await(first.forward(a))).shape == (2, 3)
        await maybe_await(client.close())
        await maybe_await(client.close())  # again: nothing happens
        report[f"{balancing} client"] = {
            name: await outcome(client, name) for name in public_methods(CLIENT_CLASSES[kind])
        }
        report[f"{balancing} session"] = {
            name: await outcome(first, name) for name in public_methods(SESSION_CLASSES[kind])
        }
        report[f"{balancing} shared array input"] = {"softmax": await outcome_of(client.softmax, x)}
        await maybe_await(second.close())  # a session closed after its client: no error
        report[f"{balancing} late session close"] = {"forward": await outcome(second, "forward")}
    return report


def racing_calls(target: str, rounds: int = 20) -> dict:
    """Threads calling through a client (creating its methods as they go) while it is
    closed under them: how their calls ended, by exception class."""
    x = np.ones((2, 3), np.float32)
    calls = [
        lambda c: c.softmax(x),
        lambda c: c.unary(x, "exp"),
        lambda c: c.info(),
        lambda c: c.list_sessions(),
        lambda c: c.eltwise([x, x], "sum"),
        lambda c: c.normalize(x, axes=[1]),
    ]
    endings: dict[str, int] = {}
    lock = threading.Lock()
    for round_number in range(rounds):
        client = tensorops.Client(target, timeout=30)
        closed = threading.Event()

        def work(call, client=client, closed=closed):  # this round's (the threads end within it)
            while True:
                try:
                    call(client)
                    ending = "returned"
                except Exception as exc:  # counted for the test
                    ending = type(exc).__name__
                with lock:
                    endings[ending] = endings.get(ending, 0) + 1
                if ending == "ClientClosedError" or closed.is_set():
                    return

        threads = [threading.Thread(target=work, args=(call,)) for call in calls]
        for t in threads:
            t.start()
        time.sleep(0.002 * (round_number % 5))  # some rounds close before the first call
        client.close()
        closed.set()
        for t in threads:
            t.join()
    return endings


if __name__ == "__main__":
    kind, target = sys.argv[1:3]
    print(json.dumps(racing_calls(target) if kind == "race" else asyncio.run(scenario(kind, target))))
    sys.exit(0)


# ---- the tests


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory):
    # Imported here: this file also runs as a script (the scenarios above), without the
    # tests' helpers on its path.
    from rpc_server import ServerProcess

    proc = ServerProcess(tmp_path_factory.mktemp("closed") / "server.log", "--allow-shared-memory", "true").start()
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def reports(shm_server):
    """Each kind's scenario, run once in its own process: kind -> (return code, report, stderr)."""
    out = {}
    for kind in CLIENT_CLASSES:
        run = subprocess.run(
            [sys.executable, __file__, kind, shm_server.target], capture_output=True, text=True, timeout=120
        )
        report = json.loads(run.stdout.splitlines()[-1]) if run.returncode == 0 and run.stdout else {}
        out[kind] = (run.returncode, report, run.stderr[-3000:])
    return out


@pytest.mark.parametrize("kind", CLIENT_CLASSES)
def test_no_crash_after_close(reports, kind):
    returncode, report, stderr = reports[kind]
    assert returncode == 0, f"exit status {returncode} (negative: killed by that signal)\n{stderr}"
    assert report


CASES = [
    (kind, cls_kind, name)
    for kind in CLIENT_CLASSES
    for cls_kind, classes in (("client", CLIENT_CLASSES), ("session", SESSION_CLASSES))
    for name in public_methods(classes[kind])
]


@pytest.mark.parametrize("kind,what,method", CASES)
def test_every_method_refuses_after_close(reports, kind, what, method):
    returncode, report, _ = reports[kind]
    assert returncode == 0
    labels = [label for label in report if label.endswith(f" {what}")]
    assert labels
    for label in labels:
        assert report[label][method] == ["ClientClosedError", CLOSED, True], label


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_shared_arrays_and_late_session_close(reports, kind):
    _, report, _ = reports[kind]
    for balancing in ("pick_first", "round_robin"):
        assert report[f"{balancing} shared array input"]["softmax"] == ["ClientClosedError", CLOSED, True]
        assert report[f"{balancing} late session close"]["forward"][0] == "ClientClosedError"


def test_the_method_lists_are_complete():
    """The generated cases reach the methods users call (a guard against an empty list)."""
    assert (
        {"softmax", "info", "list_sessions", "shared_array", "quantized_inner_product"}
        <= set(public_methods(tensorops.Client))
        == set(public_methods(tensorops.aio.Client))
    )
    assert {"forward", "describe", "external_buffer_size_for"} == set(
        public_methods(tensorops.QuantizedInnerProductSession)
    )
    assert {"forward", "external_buffer_size_for"} == set(public_methods(LocalSession))


def test_calls_after_the_with_block(shm_server):
    code = (
        "import sys, numpy as np, tensorops\n"
        "with tensorops.Client(sys.argv[1], timeout=30) as c:\n"
        "    c.softmax(np.ones(3, np.float32))\n"
        "try:\n"
        "    c.unary(np.ones(3, np.float32), 'exp')\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    run = subprocess.run([sys.executable, "-c", code, shm_server.target], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout.strip()) == (0, CLOSED), run.stderr


def test_close_under_running_calls(shm_server):
    """Calls in flight when the client closes end CANCELLED, later ones ClientClosedError;
    the process survives."""
    run = subprocess.run(
        [sys.executable, __file__, "race", shm_server.target], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"exit status {run.returncode}\n{run.stderr[-3000:]}"
    endings = json.loads(run.stdout.splitlines()[-1])
    assert set(endings) <= {"returned", "CancelledError", "ClientClosedError"}, endings
    assert endings.get("ClientClosedError", 0) > 0
