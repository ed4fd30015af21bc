"""RPC overhead of the tensorops service against the floor: a raw-bytes gRPC echo.

Starts `tensorops-server` and two echo servers (grpcio, same stack, bytes in -> the same
bytes out): the reference, a synchronous server on a ThreadPoolExecutor, and an asyncio one
(grpc.aio.server, an `async def` handler returning the request), each a subprocess on
loopback. Then prints

1. latency: for payloads from 4 KB to 16 MB, the time of one operation through a blocking
   tensorops.Client and of an echo of a message of the same size on each echo server (the
   three alternate in short blocks), the ratio to the sync echo, the in-process kernel time,
   and the ratio to sync echo + kernel;
2. throughput at 64 KB with 1, 4 and 16 concurrent blocking clients (threads, one channel
   each) for the sync echo, the aio echo, the operation and a kernel heavier than its
   transfer (a quantized inner-product session forward of 64 KB): calls/s, the ratio to the
   sync echo with as many clients, and the server process's CPU time per call (utime + stime
   from /proc/<pid>/stat over the cell) and in cores; plus one row for a tensorops.aio.Client
   (one channel, 64 calls kept in flight), to read next to the 16 blocking clients;
3. kserve: the same operation through tritonclient over the KServe V2 endpoint, with its
   tensors in the messages and in system shared memory (x read from a region, y written
   into one; the server runs with --allow-shared-memory), next to the tensorops SDK over
   the wire and through shared memory (copying NumPy arrays in and out, and zero-copy:
   x in a client.shared_array, the result written by the kernel into another given as
   out=), the in-process kernel and a tiny (4 KB) echo: ms per call, and shared memory's
   ratio to kernel + tiny echo (skipped without tritonclient[grpc]);
4. batching: two more tensorops servers, dynamic batching on (the default) and off
   (--max-batch-rows 1); 1, 4 and 16 blocking clients forward one row each (A of 1 x 1024
   uint8, B 1024 x 1024 int8) to ONE shared quantized inner-product session: calls/s,
   on / off, per-call p50/p99, and the forwards merged per kernel call (mean of the
   server's tensorops_forward_batch_requests histogram over the cell, from /metrics).
5. workers: the 64 KB operation against servers of 1 and 2 processes (--worker-counts) on
   one port, at 4, 16 and 64 calls in flight, each call on a connection of its own, from
   blocking clients in this process and from h2load (nghttp2's C load generator, when
   installed); calls/s, server CPU per call (the supervisor and all its workers) and the
   client's; then the same with the client pinned to one CPU and the server to another;
6. session-workers: one session (B 1024 x 1024) created once and forwarded from 16 channels
   of their own connections, so through every worker: forwards/s, re-creations, results
   against the in-process kernel, the sessions the server lists and the forwards it counted;
7. uvloop: part 5's cells at 16 calls with asyncio's event loop and with uvloop's (needs
   uvloop installed);
8. session-memory: the workers' summed proportional set size before and after a session of
   a 64 MiB B is created and forwarded through every worker (once, not per run).

Everything is measured --runs times (default 3, the servers stay up) and every printed cell
is the median over the runs (of per-run med for times; ratios are taken within a run).

    python bench/rpc.py                         # the full tables
    python bench/rpc.py --quick                 # a quick check that everything runs (1 run)
    python bench/rpc.py --only batching --runs 5
    python bench/rpc.py --only workers,session-workers,uvloop,session-memory --duration 5

Times are wall-clock; always compare with the echo of the same run. No assertions.
"""

from __future__ import annotations

import argparse
import collections
import copy
import importlib.util
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent import futures
from dataclasses import dataclass
from functools import partial

import numpy as np

import procfs

ECHO_METHOD = "/bench.Echo/Echo"
MAX_MESSAGE = 256 * 1024 * 1024
SIZES = {
    "4K": 4 << 10,
    "16K": 16 << 10,
    "64K": 64 << 10,
    "256K": 256 << 10,
    "1M": 1 << 20,
    "4M": 4 << 20,
    "16M": 16 << 20,
}
PARTS = ("latency", "throughput", "kserve", "batching", "workers", "session-workers", "uvloop", "session-memory")
SIDE_BY_SIDE_CALLS = 16  # calls in flight of the session-workers and uvloop parts
AIO_IN_FLIGHT = 64
ECHO_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)]


# ---------------------------------------------------------------------------------------
# Servers


def serve_echo(threads: int) -> None:
    """The sync echo server (run in a subprocess): prints its port, serves until stdin closes."""
    import grpc

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=ECHO_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


def serve_echo_aio() -> None:
    """The asyncio echo server (run in a subprocess): prints its port, serves until stdin closes."""
    import asyncio

    import grpc

    async def echo(request, context):
        return request

    async def main():
        server = grpc.aio.server(options=ECHO_OPTIONS)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop(0)

    asyncio.run(main())


def start_echo(procs: list, threads: int, aio: bool = False):
    """(process, port) of an echo server; the process is added to `procs` at once."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-echo-aio" if aio else "--serve-echo", "--threads", str(threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    line = proc.stdout.readline()
    if not line.strip():
        raise RuntimeError(f"the {'aio' if aio else 'sync'} echo server did not start")
    return proc, int(line)


@dataclass
class Server:
    """A tensorops-server: its (first) process, port, metrics port and the processes that
    serve calls (its workers; the process itself when it runs alone)."""

    proc: subprocess.Popen
    port: int
    metrics_port: int | None
    serving: list[int]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_tensorops_server(
    procs: list,
    threads: int,
    *flags: str,
    workers: int = 1,
    metrics: bool = False,
    cpus: set[int] | None = None,
    env: dict | None = None,
):
    """A tensorops-server of `workers` processes with `threads` threads each, run on `cpus`
    (None: all) with the environment `env`; its process is added to `procs` at once.
    Returns once every worker serves: when it says so in its "serving" log line (with
    several workers, the supervisor's, which lists their pids)."""
    command = [
        sys.executable,
        "-m",
        "tensorops_server",
        "--port",
        "0",
        "--metrics-port",
        "0" if metrics else "-1",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        "--max-message-bytes",
        str(MAX_MESSAGE),
        "--max-tensor-bytes",
        str(MAX_MESSAGE),
        *flags,
    ]
    if cpus is not None:  # the supervisor's CPUs are its workers' too
        command = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *command]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    procs.append(proc)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "serving" and (workers == 1 or "pids" in event):
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining the logs
            return Server(proc, event["port"], event.get("metrics_port"), event.get("pids", [proc.pid]))
    raise RuntimeError("tensorops-server did not start:\n" + "".join(seen[-20:]))


def stop(proc) -> None:
    try:
        if proc.stdin:
            proc.stdin.close()
        proc.terminate()
        proc.wait(30)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait(10)


def own_cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    """utime + stime of this process (all its threads), or of its children waited for."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def scrape(metrics_port: int) -> str:
    """The server's /metrics page (all its workers')."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        return response.read().decode()


def metric_total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` on a /metrics page whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        base, _, label_text = series.partition("{")
        if base == name and all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            total += float(value)
    return total


def batch_histogram(metrics_port: int) -> tuple[float, float]:
    """(sum, count) of the server's tensorops_forward_batch_requests histogram."""
    text = scrape(metrics_port)
    return (
        metric_total(text, "tensorops_forward_batch_requests_sum"),
        metric_total(text, "tensorops_forward_batch_requests_count"),
    )


# ---------------------------------------------------------------------------------------
# Workloads


def layer_norm_input(nbytes: int):
    channels = 64
    rows = max(1, nbytes // (4 * channels))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, rows, channels)).astype(np.float32)
    return (x, np.ones(channels, np.float32), np.zeros(channels, np.float32)), dict(format="nhwc")


OPERATIONS = {
    # name: (function name, kernels it needs, input builder)
    "layer_norm_channels": ("layer_norm_channels", ("SynetNormalizeLayerForwardV2",), layer_norm_input),
    "softmax": (
        "softmax",
        ("SynetSoftmax32f",),
        lambda n: ((np.random.default_rng(0).standard_normal((max(1, n // 4096), 1024)).astype(np.float32),), {}),
    ),
    "unary": (
        "unary",
        ("SynetUnaryOperation32f",),
        lambda n: ((np.random.default_rng(0).standard_normal(max(1, n // 4)).astype(np.float32), "neg"), {}),
    ),
    "eltwise": (
        "eltwise",
        ("SynetEltwiseLayerForward",),
        lambda n: (([np.ones(max(1, n // 8), np.float32)] * 2, "sum"), {}),
    ),
}


def available(kernels) -> bool:
    import tensorops_native as tn

    report = tn.kernels()
    return all(report.get(k, "missing") != "missing" for k in kernels)


def qip_available() -> bool:
    import tensorops_native as tn

    return hasattr(tn, "QuantizedInnerProduct") and all(
        v != "missing" for k, v in tn.kernels().items() if "Quantized" in k
    )


def qip_session_parameters(k: int = 1024, n: int = 1024):
    rng = np.random.default_rng(0)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    return b, dict(b_scale=np.full(n, 0.01, np.float32), a_scale=0.05, a_zero=3, c_scale=0.5, c_zero=1)


def median_time(fn, repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def repeats_for(nbytes: int, base: int) -> int:
    return max(5, min(base, int(base * (256 << 10) / max(nbytes, 1))))


def _arg_names(fname: str) -> list[str]:
    import inspect

    import tensorops_native as tn

    return list(inspect.signature(getattr(tn, fname)).parameters)


def _request_bytes(fname: str, args, kwargs) -> bytes:
    from tensorops.protocol import wire

    return wire.build_request(wire.OPERATIONS[fname], dict(zip(_arg_names(fname), args, strict=False), **kwargs)).data


def _echo_channel(port: int):
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=ECHO_OPTIONS)
    return channel, channel.unary_unary(ECHO_METHOD, _registered_method=True)


# ---------------------------------------------------------------------------------------
# Latency


def latency_run(target: str, echo_ports: dict, op_name: str, sizes: dict, base_repeat: int) -> dict:
    """{payload label: (sync echo s, aio echo s, tensorops s, kernel s)}, med of one run."""
    import tensorops
    import tensorops_native as tn

    fname, _, build = OPERATIONS[op_name]
    results = {}
    sync_channel, sync_echo = _echo_channel(echo_ports["sync"])
    aio_channel, aio_echo = _echo_channel(echo_ports["aio"])
    try:
        with tensorops.Client(target, max_message_bytes=MAX_MESSAGE) as client:
            fn = getattr(client, fname)
            native = getattr(tn, fname)
            for label, nbytes in sizes.items():
                args, kwargs = build(nbytes)
                request = _request_bytes(fname, args, kwargs)
                sides = [partial(sync_echo, request), partial(aio_echo, request), partial(fn, *args, **kwargs)]
                repeat = repeats_for(nbytes, base_repeat)
                # alternate short runs of each, so drifts of the machine hit all alike while
                # each side runs as it would in a loop of its own calls
                times = [[] for _ in sides]
                block = max(1, min(10, repeat // 10))
                for _ in range(2):
                    for side in sides:
                        side()
                for _ in range(0, repeat, block):
                    for side, t in zip(sides, times, strict=True):
                        for _ in range(block):
                            start = time.perf_counter()
                            side()
                            t.append(time.perf_counter() - start)
                k = median_time(partial(native, *args, **kwargs), repeat)
                results[label] = tuple(statistics.median(t) for t in times) + (k,)
    finally:
        sync_channel.close()
        aio_channel.close()
    return results


def print_latency(op_name: str, sizes: dict, runs: list[dict]) -> None:
    print(
        f"\n## Latency: {op_name}, one blocking client, ms per call "
        f"(median over {len(runs)} run{'s' if len(runs) > 1 else ''} of the per-run median)\n"
    )
    print(
        "| payload | sync echo ms | aio echo ms | tensorops ms | tensorops / sync echo | kernel ms "
        "| tensorops / (sync echo + kernel) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print_rows(
        sizes,
        runs,
        [lambda s, a, c, k: s, lambda s, a, c, k: a, lambda s, a, c, k: c],
        [lambda s, a, c, k: c / s],
        [lambda s, a, c, k: k],
        [lambda s, a, c, k: c / (s + k)],
    )


def print_rows(sizes: dict, runs: list[dict], *columns) -> None:
    """One table row per payload: groups of columns alternate between times (ms) and
    ratios; each cell is the median over the runs of its function of the run's tuple."""
    for label in sizes:
        rows = [run[label] for run in runs]
        cells = []
        for group, functions in enumerate(columns):
            for f in functions:
                value = statistics.median(f(*r) for r in rows)
                cells.append(f"{value * 1e3:.3f}" if group % 2 == 0 else f"{value:.2f}")
        print(f"| {label} | {' | '.join(cells)} |")


# ---------------------------------------------------------------------------------------
# KServe V2: tritonclient over the wire and through system shared memory


def kserve_available() -> bool:
    try:
        import tritonclient.grpc
        import tritonclient.utils.shared_memory  # noqa: F401
    except ImportError:
        return False
    return True


def kserve_run(target: str, echo_port: int, op_name: str, sizes: dict, base_repeat: int) -> dict:
    """{payload label: (tensorops s, tensorops shm s, tensorops zero-copy s, triton wire s, triton shm s,
    kernel s, 4 KB echo s)}."""
    import tritonclient.grpc as tc
    import tritonclient.utils.shared_memory as shm

    import tensorops
    import tensorops_native as tn

    fname, _, build = OPERATIONS[op_name]
    names = _arg_names(fname)
    results = {}
    echo_channel, echo = _echo_channel(echo_port)
    tiny = bytes(4 << 10)
    triton = tc.InferenceServerClient(target)
    try:
        with (
            tensorops.Client(target, max_message_bytes=MAX_MESSAGE) as client,
            tensorops.Client(
                target, max_message_bytes=MAX_MESSAGE, shared_memory=True, shared_memory_prefix="tensorops_bench_"
            ) as shared_client,
        ):
            for label, nbytes in sizes.items():
                args, kwargs = build(nbytes)
                arrays = {n: a for n, a in zip(names, args, strict=False) if isinstance(a, np.ndarray)}
                parameters = {n: v for n, v in zip(names, args, strict=False) if not isinstance(v, np.ndarray)}
                parameters.update(kwargs)
                x = arrays["x"]
                wire_inputs = []
                for name, arr in arrays.items():
                    t = tc.InferInput(name, list(arr.shape), "FP32")
                    t.set_data_from_numpy(arr)
                    wire_inputs.append(t)
                key = f"/tensorops_bench_{os.getpid()}_{label}"
                handle = shm.create_shared_memory_region(key[1:], key, 2 * x.nbytes)
                try:
                    shm.set_shared_memory_region(handle, [x])
                    triton.register_system_shared_memory(label, key, 2 * x.nbytes)
                    x_in = tc.InferInput("x", list(x.shape), "FP32")
                    x_in.set_shared_memory(label, x.nbytes)
                    y_out = tc.InferRequestedOutput("y")
                    y_out.set_shared_memory(label, x.nbytes, offset=x.nbytes)
                    shm_inputs = [x_in] + [t for t in wire_inputs if t.name() != "x"]
                    # zero copy: x in a shared_array, y written by the kernel into another
                    x_shared = shared_client.shared_array(x.shape, x.dtype)
                    x_shared[...] = x
                    y_shared = shared_client.shared_array(x.shape, x.dtype)
                    zero_args = (x_shared,) + tuple(args[1:])
                    sides = [
                        partial(getattr(client, fname), *args, **kwargs),
                        partial(getattr(shared_client, fname), *args, **kwargs),
                        partial(getattr(shared_client, fname), *zero_args, out=y_shared, **kwargs),
                        partial(triton.infer, fname, wire_inputs, parameters=parameters),
                        partial(triton.infer, fname, shm_inputs, parameters=parameters, outputs=[y_out]),
                        partial(getattr(tn, fname), *args, **kwargs),
                        lambda: echo(tiny),
                    ]
                    repeat = repeats_for(nbytes, base_repeat)
                    results[label] = tuple(median_time(side, repeat) for side in sides)
                finally:
                    triton.unregister_system_shared_memory(label)
                    shm.destroy_shared_memory_region(handle)
    finally:
        triton.close()
        echo_channel.close()
    return results


def print_kserve(op_name: str, sizes: dict, runs: list[dict]) -> None:
    print(
        f"\n## KServe V2: {op_name} through tritonclient, ms per call (median over {len(runs)} "
        f"run{'s' if len(runs) > 1 else ''} of the per-run median)\n"
    )
    print(
        "tritonclient shm: x read from a registered region and y written into one (and left there); the "
        "other (small) inputs in the message. SDK shm: tensorops.Client(shared_memory=True) given NumPy "
        "arrays, which copies x into its region and y out of it into a new array. SDK zero-copy: the same "
        "client given x in a client.shared_array and out= another (read and written in place, as tritonclient "
        "shm). Kernel: the in-process call (a new result each time). Target: shm <= 1.5 x (kernel + 4 KB "
        "echo).\n"
    )
    print(
        "| payload | SDK ms | SDK shm ms | SDK zero-copy ms | tritonclient ms | tritonclient shm ms | kernel ms "
        "| 4 KB echo ms | SDK shm / (kernel + echo) | SDK zero-copy / (kernel + echo) "
        "| tritonclient shm / (kernel + echo) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    # SDK, SDK shm, SDK zero-copy, tritonclient, tritonclient shm, kernel, echo
    times = [lambda *r, i=i: r[i] for i in range(7)]
    print_rows(
        sizes,
        runs,
        times,
        [
            lambda t, ts, tz, w, m, k, e: ts / (k + e),
            lambda t, ts, tz, w, m, k, e: tz / (k + e),
            lambda t, ts, tz, w, m, k, e: m / (k + e),
        ],
    )


# ---------------------------------------------------------------------------------------
# Throughput


@dataclass
class Cell:
    rate: float  # calls/s
    cpu_per_call: float  # server CPU seconds per call
    cpu_cores: float  # server CPU seconds per second
    p50: float  # seconds per call
    p99: float
    batch: float = float("nan")  # forwards per kernel call (batching servers only)
    client_cpu_per_call: float = float("nan")  # the client's CPU seconds per call
    switches_per_call: float = float("nan")  # context switches of the server's threads per call


def _cell(
    calls: int,
    elapsed: float,
    cpu: float,
    latencies,
    batch=float("nan"),
    client_cpu=float("nan"),
    switches=float("nan"),
) -> Cell:
    p50, p99 = np.percentile(latencies, [50, 99]) if len(latencies) else (float("nan"),) * 2
    per_call = (lambda total: total / calls) if calls else (lambda total: float("nan"))
    return Cell(
        calls / elapsed,
        per_call(cpu),
        cpu / elapsed,
        float(p50),
        float(p99),
        batch,
        per_call(client_cpu),
        per_call(switches),
    )


def throughput(make_call, clients: int, duration: float, pid: int, metrics_port: int | None = None) -> Cell:
    """`clients` threads, each with its own call (and channel), calling for `duration` s;
    the CPU time of the server (process `pid` and its workers) and of this process are
    read around the cell."""
    calls, threads = [], []
    ready = threading.Barrier(clients + 1)
    go, stop_event = threading.Event(), threading.Event()
    try:
        for _ in range(clients):
            calls.append(make_call())
        latencies = [[] for _ in range(clients)]
        errors = []

        def worker(i):
            call, _ = calls[i]
            try:
                call()  # warm up the channel
                ready.wait()
                go.wait()
                times = latencies[i]
                while not stop_event.is_set():
                    start = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - start)
            except threading.BrokenBarrierError:
                pass
            except Exception as exc:
                errors.append(exc)
                ready.abort()
                stop_event.set()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            pass
        batch0 = batch_histogram(metrics_port) if metrics_port and not errors else None
        switches0 = procfs.tree_context_switches(pid)
        cpu0, client0 = procfs.tree_cpu_seconds(pid), own_cpu_seconds()
        begin = time.perf_counter()
        go.set()
        stop_event.wait(duration)
        stop_event.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - begin
        cpu, client = procfs.tree_cpu_seconds(pid) - cpu0, own_cpu_seconds() - client0
        switches = procfs.tree_context_switches(pid) - switches0
        if errors:
            raise errors[0]
        batch = float("nan")
        if batch0 is not None:
            s, n = batch_histogram(metrics_port)
            batch = (s - batch0[0]) / (n - batch0[1]) if n > batch0[1] else float("nan")
        all_times = [x for t in latencies for x in t]
        return _cell(len(all_times), elapsed, cpu, all_times, batch, client, switches)
    finally:  # also on an error or Ctrl-C here: let the threads end before closing their channels
        stop_event.set()
        ready.abort()
        go.set()
        for t in threads:
            if t.is_alive():
                t.join()
        for _, close in calls:
            close()


def aio_throughput(target: str, fname: str, args, kwargs, in_flight: int, duration: float, pid: int) -> Cell:
    """One tensorops.aio.Client (one channel) with `in_flight` coroutines each calling in a loop."""
    import asyncio

    import tensorops.aio

    async def run():
        async with tensorops.aio.Client(target, max_message_bytes=MAX_MESSAGE) as client:
            fn = getattr(client, fname)
            await asyncio.gather(*(fn(*args, **kwargs) for _ in range(in_flight)))  # warm up
            times = []
            cpu0 = procfs.tree_cpu_seconds(pid)
            begin = time.perf_counter()
            deadline = begin + duration

            async def worker():
                while time.perf_counter() < deadline:
                    start = time.perf_counter()
                    await fn(*args, **kwargs)
                    times.append(time.perf_counter() - start)

            await asyncio.gather(*(worker() for _ in range(in_flight)))
            elapsed = time.perf_counter() - begin
            return _cell(len(times), elapsed, procfs.tree_cpu_seconds(pid) - cpu0, times)

    return asyncio.run(run())


def op_call_maker(target: str, op_name: str, options=()):
    """make_call for throughput(): a tensorops.Client of its own calling the operation at 64 KB."""
    import tensorops

    fname, _, build = OPERATIONS[op_name]
    args, kwargs = build(64 << 10)

    def make():
        c = tensorops.Client(target, max_message_bytes=MAX_MESSAGE, options=options)
        fn = getattr(c, fname)
        return (lambda: fn(*args, **kwargs)), c.close

    return make


def throughput_workloads(target: str, echo_ports: dict, op_name: str):
    """[(label, kind, make_call)]; kind names the server: 'sync', 'aio' or 'tensorops'."""
    fname, _, build = OPERATIONS[op_name]
    small_args, small_kwargs = build(64 << 10)
    small_request = _request_bytes(fname, small_args, small_kwargs)
    workloads = []
    for kind in ("sync", "aio"):

        def echo_call(port=echo_ports[kind]):
            channel, echo = _echo_channel(port)
            return (lambda: echo(small_request)), channel.close

        workloads.append((f"{kind} echo 64 KB", kind, echo_call))

    workloads.append((f"{op_name} 64 KB", "tensorops", op_call_maker(target, op_name)))

    heavy = heavy_workload(target)
    if heavy is not None:
        workloads.append((heavy[0], "tensorops", heavy[1]))
    return workloads


def throughput_run(target: str, echo_ports: dict, pids: dict, op_name: str, client_counts, duration: float) -> dict:
    """{(workload label, clients): Cell}; clients is 'aio' for the asyncio client row."""
    fname, _, build = OPERATIONS[op_name]
    results = {}
    for label, kind, make in throughput_workloads(target, echo_ports, op_name):
        for n in client_counts:
            results[label, n] = throughput(make, n, duration, pids[kind])
        if label == f"{op_name} 64 KB":
            args, kwargs = build(64 << 10)
            results[label, "aio"] = aio_throughput(
                target, fname, args, kwargs, AIO_IN_FLIGHT, duration, pids["tensorops"]
            )
    return results


def print_throughput(runs: list[dict], client_counts, duration: float, workers: int) -> None:
    n_runs = len(runs)
    print(
        f"\n## Throughput at 64 KB: calls/s and server CPU, {duration:g} s per cell, median over {n_runs} "
        f"run{'s' if n_runs > 1 else ''}; tensorops server workers = {workers}\n"
    )
    print(
        "Blocking clients are threads with one channel each. Ratios are taken within a run: "
        "'vs 1 client' to the same workload with 1 client, '/ sync echo' to the sync echo with as many "
        f"clients (the aio client row: with {client_counts[-1]}). Server CPU is utime + stime of the "
        "server's processes (all its workers) over the cell; 'cores' is CPU seconds per second.\n"
    )
    print("| workload | clients | calls/s | vs 1 client | / sync echo | server CPU µs/call | server CPU cores |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    sync_label = "sync echo 64 KB"
    for label in dict.fromkeys(key[0] for key in runs[0]):
        for n in [c for c in list(client_counts) + ["aio"] if (label, c) in runs[0]]:
            cells = [run[label, n] for run in runs]
            ref_n = client_counts[-1] if n == "aio" else n
            rate = statistics.median(run[label, n].rate for run in runs)
            vs_one = statistics.median(run[label, n].rate / run[label, client_counts[0]].rate for run in runs)
            vs_sync = statistics.median(run[label, n].rate / run[sync_label, ref_n].rate for run in runs)
            cpu = statistics.median(c.cpu_per_call for c in cells)
            cores = statistics.median(c.cpu_cores for c in cells)
            who = f"1 aio channel, {AIO_IN_FLIGHT} in flight" if n == "aio" else str(n)
            print(f"| {label} | {who} | {rate:.0f} | {vs_one:.2f}x | {vs_sync:.2f} | {cpu * 1e6:.0f} | {cores:.2f} |")


def _server_workers(target: str) -> int:
    import tensorops

    with tensorops.Client(target) as c:
        return c.info()["workers"]


def heavy_workload(target: str):
    """A kernel heavier than its transfer: a quantized inner-product session forward
    (M x K x N multiply-adds for M x K bytes in, M x N out), else unary tanh."""
    import tensorops

    rng = np.random.default_rng(0)
    if qip_available():
        m, k, n = 64, 1024, 1024
        b, params = qip_session_parameters(k, n)
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)

        def make():
            c = tensorops.Client(target, max_message_bytes=MAX_MESSAGE)
            s = c.quantized_inner_product(b, **params)
            return (lambda: s.forward(a)), (lambda: (s.close(), c.close()))

        return f"qip forward {m}x{k}x{n}", make
    if available(("SynetUnaryOperation32f",)):
        x = rng.standard_normal(64 << 10).astype(np.float32)

        def make():
            c = tensorops.Client(target, max_message_bytes=MAX_MESSAGE)
            return (lambda: c.unary(x, "tanh")), c.close

        return "unary tanh 256 KB", make
    return None


# ---------------------------------------------------------------------------------------
# Batching


class SharedSession:
    """One quantized inner-product session (B k x n int8) on a server, opened once on its
    own client. Every client thread gets a tensorops.Client of its own (channel options
    `options`: a connection of its own or not) forwarding its own row of A (1 x k) to this
    session and checking each result against the in-process kernel. Counts forwards,
    wrong results and re-creations, and which worker each thread's channel reached."""

    ROWS = 16

    def __init__(self, target: str, options=(), k: int = 1024, n: int = 1024):
        import tensorops
        import tensorops_native as tn

        self.target, self.options = target, options
        b, params = qip_session_parameters(k, n)
        rng = np.random.default_rng(1)
        self.rows = [rng.integers(0, 256, (1, k), dtype=np.uint8) for _ in range(self.ROWS)]
        with tn.QuantizedInnerProduct(b, **params) as reference:
            self.expected = [reference.forward(a) for a in self.rows]
        self.copies: list = []
        self.counts: list[list[int]] = []  # per thread: [forwards, wrong results]
        self.channel_workers: collections.Counter = collections.Counter()  # worker id -> channels
        self.owner = tensorops.Client(target, max_message_bytes=MAX_MESSAGE)
        try:
            self.session = self.owner.quantized_inner_product(b, **params)
        except BaseException:
            self.owner.close()
            raise

    def make_call(self):
        import tensorops

        i = len(self.counts) % self.ROWS
        c = tensorops.Client(self.target, max_message_bytes=MAX_MESSAGE, options=self.options)
        self.channel_workers[c.info().get("worker")] += 1
        # the same session (same id, same state) bound to this thread's own client and
        # channel; never closed itself: that would release the shared session
        s = copy.copy(self.session)
        s._client = c
        self.copies.append(s)
        a, expected = self.rows[i], self.expected[i]
        counts = [0, 0]
        self.counts.append(counts)

        def call():
            counts[0] += 1
            if not np.array_equal(s.forward(a), expected):
                counts[1] += 1

        return call, c.close

    def tally(self) -> tuple[int, int, int]:
        """(forwards, wrong results, re-creations) so far, by every thread."""
        return (
            sum(c[0] for c in self.counts),
            sum(c[1] for c in self.counts),
            self.session.recreated + sum(s.recreated for s in self.copies),
        )

    def close(self) -> None:
        try:
            self.session.close()
        finally:
            self.owner.close()


def batching_run(servers: dict, client_counts, duration: float) -> dict:
    """{(clients, 'off' | 'on'): Cell}; servers: {'off' | 'on': (SharedSession, pid, metrics port)}."""
    results = {}
    for n in client_counts:
        for mode in ("off", "on"):
            shared, pid, metrics_port = servers[mode]
            results[n, mode] = throughput(shared.make_call, n, duration, pid, metrics_port)
    return results


def print_batching(runs: list[dict], client_counts, duration: float) -> None:
    n_runs = len(runs)
    print(
        f"\n## Batching: quantized inner-product session forwards of one row (A 1 x 1024 uint8, B 1024 x 1024 "
        f"int8), {duration:g} s per cell, median over {n_runs} run{'s' if n_runs > 1 else ''}\n"
    )
    print(
        "Blocking clients are threads, each with its own tensorops.Client (channel), all forwarding to ONE "
        "session opened once on a separate client. Batching off: a server with --max-batch-rows 1; on: the "
        "defaults. Forwards per kernel call: mean of tensorops_forward_batch_requests (sum / count over the "
        "cell) from the server's /metrics.\n"
    )
    print(
        "| clients | batching off calls/s | batching on calls/s | on / off | off p50 ms | on p50 ms | off p99 ms "
        "| on p99 ms | forwards per kernel call (off / on) | server CPU µs/call (off / on) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in client_counts:
        med = {
            (mode, attr): statistics.median(getattr(run[n, mode], attr) for run in runs)
            for mode in ("off", "on")
            for attr in ("rate", "p50", "p99", "batch", "cpu_per_call")
        }

        ratio = statistics.median(run[n, "on"].rate / run[n, "off"].rate for run in runs)
        print(
            f"| {n} | {med['off', 'rate']:.0f} | {med['on', 'rate']:.0f} | {ratio:.2f}x "
            f"| {med['off', 'p50'] * 1e3:.3f} | {med['on', 'p50'] * 1e3:.3f} | {med['off', 'p99'] * 1e3:.3f} "
            f"| {med['on', 'p99'] * 1e3:.3f} | {med['off', 'batch']:.2f} / {med['on', 'batch']:.2f} "
            f"| {med['off', 'cpu_per_call'] * 1e6:.0f} / {med['on', 'cpu_per_call'] * 1e6:.0f} |"
        )


# ---------------------------------------------------------------------------------------
# Workers: several server processes on one port

# gRPC shares one connection between the channels of a process whose arguments are equal;
# this option gives a channel its own. The kernel spreads connections, not calls, over the
# workers, so every concurrent client needs a connection of its own to reach them all.
OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)
SESSION_MEMORY_K = SESSION_MEMORY_N = 8192  # a 64 MiB B
UVLOOP_POLICY = "import asyncio\nimport uvloop\n\nasyncio.set_event_loop_policy(uvloop.EventLoopPolicy())\n"


class Servers:
    """The tensorops servers of the worker parts, each started at its first use and kept up
    for every run: one per (workers, pinned to `server_cpus` or not, event loop)."""

    def __init__(self, procs: list, threads: int, server_cpus: set[int] | None, scratch: str):
        self.procs, self.threads, self.server_cpus, self.scratch = procs, threads, server_cpus, scratch
        self.started: dict[tuple, Server] = {}

    def get(self, workers: int, pinned: bool = False, loop: str = "asyncio") -> Server:
        key = (workers, pinned, loop)
        if key not in self.started:
            self.started[key] = self.start(workers, pinned, loop)
        return self.started[key]

    def start(self, workers: int, pinned: bool = False, loop: str = "asyncio", *flags: str) -> Server:
        env = None
        if loop == "uvloop":
            # the server has no switch for it: every process it starts (supervisor, workers)
            # imports sitecustomize at startup, which makes uvloop asyncio's event loop
            with open(os.path.join(self.scratch, "sitecustomize.py"), "w") as f:
                f.write(UVLOOP_POLICY)
            env = dict(
                os.environ, PYTHONPATH=os.pathsep.join(filter(None, [self.scratch, os.environ.get("PYTHONPATH")]))
            )
        server = start_tensorops_server(
            self.procs,
            self.threads,
            *flags,
            workers=workers,
            metrics=True,
            cpus=self.server_cpus if pinned else None,
            env=env,
        )
        if len(server.serving) != workers:
            raise RuntimeError(f"asked for {workers} workers, the server says it runs {len(server.serving)}")
        if loop == "uvloop":
            for pid in server.serving:
                if not any("uvloop" in path for path in procfs.mapped_paths(pid)):
                    raise RuntimeError(f"uvloop is not loaded in the server process {pid}")
        return server


def h2load_available() -> bool:
    return shutil.which("h2load") is not None


def h2load_throughput(server: Server, body: str, path: str, clients: int, duration: float, cpus) -> Cell:
    """nghttp2's h2load posting the gRPC message in file `body` to `path`: `clients`
    connections, one call in flight on each, for `duration` s, on `cpus` (None: any). h2load
    does not read gRPC's status (it is in the trailers), so the server's count of calls that
    ended OK is checked against the responses h2load counted."""
    command = ["h2load", "-c", str(clients), "-m", "1", "-t", "1", "-D", f"{round(duration * 1000)}ms", "-d", body]
    command += ["-H", "content-type: application/grpc", "-H", "te: trailers", f"http://{server.target}{path}"]
    if cpus is not None:
        command = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *command]
    ok0 = metric_total(scrape(server.metrics_port), "tensorops_request_duration_seconds_count", code="OK")
    switches0 = procfs.tree_context_switches(server.pid)
    cpu0, client0 = procfs.tree_cpu_seconds(server.pid), own_cpu_seconds(resource.RUSAGE_CHILDREN)
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    cpu, client = procfs.tree_cpu_seconds(server.pid) - cpu0, own_cpu_seconds(resource.RUSAGE_CHILDREN) - client0
    switches = procfs.tree_context_switches(server.pid) - switches0
    ok = metric_total(scrape(server.metrics_port), "tensorops_request_duration_seconds_count", code="OK") - ok0
    found = re.search(r"requests: .* (\d+) succeeded, (\d+) failed", out.stdout)
    if out.returncode != 0 or not found:
        raise RuntimeError(f"h2load failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    succeeded, failed = int(found.group(1)), int(found.group(2))
    if failed or ok < succeeded:
        raise RuntimeError(f"h2load: {succeeded} responses ({failed} failed), but the server ended {ok:.0f} calls OK")
    return _cell(succeeded, duration, cpu, [], client_cpu=client, switches=switches)


class LoadClients:
    """The clients of the workers and uvloop parts: 'python', blocking tensorops.Client
    objects in threads of this process, and 'h2load' (when installed), each concurrent call
    on a connection of its own; `client_cpus` is where they run when pinned."""

    def __init__(self, op_name: str, client_cpus: set[int] | None, scratch: str):
        from tensorops.protocol import wire

        fname, _, build = OPERATIONS[op_name]
        args, kwargs = build(64 << 10)
        request = _request_bytes(fname, args, kwargs)
        self.op_name, self.client_cpus = op_name, client_cpus
        self.path = wire.OPERATIONS[fname].path
        self.body = os.path.join(scratch, "request.grpc")
        with open(self.body, "wb") as f:  # one gRPC message: uncompressed, its length, the request
            f.write(b"\0" + len(request).to_bytes(4, "big") + request)
        self.kinds = ("python", "h2load") if h2load_available() else ("python",)

    def cell(self, kind: str, server: Server, clients: int, duration: float, pinned: bool) -> Cell:
        cpus = self.client_cpus if pinned else None
        if kind == "h2load":
            return h2load_throughput(server, self.body, self.path, clients, duration, cpus)
        with procfs.pinned_threads(cpus):
            return throughput(op_call_maker(server.target, self.op_name, OWN_CONNECTION), clients, duration, server.pid)


def workers_run(servers: Servers, load: LoadClients, worker_counts, concurrency, duration: float, pins) -> dict:
    """{(client kind, pinned, calls in flight, workers): Cell}; the worker counts alternate
    innermost, so that each comparison is measured side by side."""
    results = {}
    for kind in load.kinds:
        for pinned in pins:
            for n in concurrency:
                for workers in worker_counts:
                    server = servers.get(workers, pinned)
                    results[kind, pinned, n, workers] = load.cell(kind, server, n, duration, pinned)
    return results


def _runs_note(runs: list, duration: float) -> str:
    return f"{duration:g} s per cell, median over {len(runs)} run{'s' if len(runs) > 1 else ''}"


def _med(runs: list[dict], key, attr: str) -> float:
    """Median over the runs of one attribute of the cell `key`."""
    return statistics.median(getattr(run[key], attr) for run in runs)


def _ratio(runs: list[dict], key, reference, attr: str) -> float:
    """Median over the runs of cell `key`'s attribute over cell `reference`'s, each within its run."""
    return statistics.median(getattr(run[key], attr) / getattr(run[reference], attr) for run in runs)


def print_workers(op_name: str, runs: list[dict], worker_counts, concurrency, duration, pins, cpus) -> None:
    first, last = worker_counts[0], worker_counts[-1]
    print(
        f"\n## Workers: {op_name} at 64 KB through one port served by "
        f"{' or '.join(map(str, worker_counts))} processes, {_runs_note(runs, duration)}\n"
    )
    print(
        "Every call in flight has a channel and a connection of its own (the kernel spreads connections, "
        "not calls, over the workers). Clients: python, a blocking tensorops.Client per thread in the "
        "benchmark's process (encoding and decoding NumPy arrays); h2load, nghttp2's C load generator "
        "(one thread, one call in flight per connection) posting the same encoded request, to show what "
        "the server does when the client costs little. Server CPU: utime + stime of the server's processes "
        "(supervisor and workers) over the cell, per call and in cores; client CPU: the benchmark process's "
        "or h2load's, per call; context switches: voluntary and forced, of every thread of the server's "
        f"processes. Ratios are {last} / {first} workers within a run. "
        + (
            f"Pinned: the client on CPU {min(cpus[0])}, every server process on CPU {min(cpus[1])}.\n"
            if cpus
            else "Pinned rows need two CPUs.\n"
        )
    )
    cols = " / ".join(map(str, worker_counts))
    print(
        "| client | pinned | calls in flight | "
        + " | ".join(f"calls/s, {w} worker{'s' if w > 1 else ''}" for w in worker_counts)
        + f" | calls/s {last} / {first} | server CPU µs/call ({cols}) | CPU/call {last} / {first} "
        f"| server cores ({cols}) | client CPU µs/call ({cols}) | server context switches/call ({cols}) |"
    )
    print("| --- | --- | ---: " + "| ---: " * (len(worker_counts) + 6) + "|")
    kinds = list(dict.fromkeys(key[0] for key in runs[0]))
    for kind in kinds:
        for pinned in pins:
            for n in concurrency:
                keys = [(kind, pinned, n, w) for w in worker_counts]

                def per_worker(attr: str, scale: float, digits: int, keys=keys) -> str:
                    return " / ".join(f"{_med(runs, key, attr) * scale:.{digits}f}" for key in keys)

                print(
                    f"| {kind} | {'yes' if pinned else 'no'} | {n} | "
                    + " | ".join(f"{_med(runs, key, 'rate'):.0f}" for key in keys)
                    + f" | {_ratio(runs, keys[-1], keys[0], 'rate'):.2f}x | {per_worker('cpu_per_call', 1e6, 0)} "
                    f"| {_ratio(runs, keys[-1], keys[0], 'cpu_per_call'):.2f} | {per_worker('cpu_cores', 1, 2)} "
                    f"| {per_worker('client_cpu_per_call', 1e6, 0)} | {per_worker('switches_per_call', 1, 1)} |"
                )
    n = 16 if 16 in concurrency else concurrency[len(concurrency) // 2]
    print(f"\nTargets at {n} calls in flight, {last} workers against {first}:\n")
    print(
        f"| client | pinned | calls/s {last} / {first} (target >= 1.3x) "
        f"| server CPU per call {last} / {first} (target 0.90-1.10) |"
    )
    print("| --- | --- | ---: | ---: |")
    for kind in kinds:
        for pinned in pins:
            key, reference = (kind, pinned, n, last), (kind, pinned, n, first)
            print(
                f"| {kind} | {'yes' if pinned else 'no'} | {_ratio(runs, key, reference, 'rate'):.2f}x "
                f"| {_ratio(runs, key, reference, 'cpu_per_call'):.2f} |"
            )


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def uvloop_run(servers: Servers, load: LoadClients, worker_counts, clients: int, duration: float) -> dict:
    """{(client kind, workers, event loop): Cell}, the two loops alternating innermost."""
    results = {}
    for kind in load.kinds:
        for workers in worker_counts:
            for loop in ("asyncio", "uvloop"):
                results[kind, workers, loop] = load.cell(
                    kind, servers.get(workers, loop=loop), clients, duration, False
                )
    return results


def print_uvloop(op_name: str, runs: list[dict], worker_counts, clients: int, duration: float) -> None:
    print(f"\n## uvloop: {op_name} at 64 KB, {clients} calls in flight, {_runs_note(runs, duration)}\n")
    print(
        "The same server with asyncio's own event loop and with uvloop's (made the event loop policy of "
        "every server process at startup; checked loaded in each worker). Clients as in the workers table; "
        "ratios within a run.\n"
    )
    print(
        "| client | workers | calls/s asyncio | calls/s uvloop | uvloop / asyncio | server CPU µs/call asyncio "
        "| server CPU µs/call uvloop | CPU/call uvloop / asyncio |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for kind in dict.fromkeys(key[0] for key in runs[0]):
        for w in worker_counts:
            plain, uv = (kind, w, "asyncio"), (kind, w, "uvloop")
            print(
                f"| {kind} | {w} | {_med(runs, plain, 'rate'):.0f} | {_med(runs, uv, 'rate'):.0f} "
                f"| {_ratio(runs, uv, plain, 'rate'):.2f}x | {_med(runs, plain, 'cpu_per_call') * 1e6:.0f} "
                f"| {_med(runs, uv, 'cpu_per_call') * 1e6:.0f} | {_ratio(runs, uv, plain, 'cpu_per_call'):.2f} |"
            )


def session_workers_run(sessions: dict, clients: int, duration: float) -> dict:
    """{workers: Cell, ("checks", workers): dict}; sessions: {workers: (SharedSession,
    Server)}. Each cell opens `clients` new channels (of their own connections) to the one
    session."""

    def server_view(shared: SharedSession, server: Server) -> tuple[float, int, int]:
        """(sessions created, sessions listed, forwards of the shared session) as the server says."""
        created = metric_total(
            scrape(server.metrics_port),
            "tensorops_request_duration_seconds_count",
            operation="create_quantized_inner_product",
        )
        listed = shared.owner.list_sessions()
        forwards = next((s["forward_count"] for s in listed if s["session_id"] == shared.session.session_id), 0)
        return created, len(listed), forwards

    results = {}
    for workers, (shared, server) in sessions.items():
        created0, _, counted0 = server_view(shared, server)
        sent0, wrong0, recreated0 = shared.tally()
        shared.channel_workers.clear()
        results[workers] = throughput(shared.make_call, clients, duration, server.pid)
        created, listed, counted = server_view(shared, server)
        sent, wrong, recreated = shared.tally()
        results["checks", workers] = {
            "channels": dict(sorted(shared.channel_workers.items(), key=str)),
            "recreated": recreated - recreated0 + created - created0,
            "wrong": wrong - wrong0,
            "sessions": listed,
            "counted": counted - counted0,
            "sent": sent - sent0,
        }
    return results


def print_session_workers(runs: list[dict], clients: int, duration: float) -> None:
    print(
        f"\n## Session from {clients} channels: forwards of one row (A 1 x 1024 uint8, B 1024 x 1024 int8) to one "
        f"session, {_runs_note(runs, duration)}\n"
    )
    print(
        f"The session is created once; each cell opens {clients} channels of their own connections (so they "
        "land on every worker) that forward to it, each its own row of A, every result compared with the "
        "in-process tensorops_native.QuantizedInnerProduct. Re-creations: the clients' own count plus the "
        "server's CreateQuantizedInnerProduct calls over the cell (/metrics). Sessions listed and forwards "
        "counted: ListSessions after the cell, against the forwards sent (warm-up included). The checks are "
        "summed over the runs.\n"
    )
    worker_counts = [key for key in runs[0] if isinstance(key, int)]
    first = worker_counts[0]
    print(
        "| workers | channels per worker (last run) | forwards/s | vs 1st row | server CPU µs/forward | re-creations "
        "| results differing | sessions listed | forwards counted / sent |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for w in worker_counts:
        checks = [run["checks", w] for run in runs]
        channels = ", ".join(f"{k}: {v}" for k, v in checks[-1]["channels"].items())
        print(
            f"| {w} | {channels} | {_med(runs, w, 'rate'):.0f} | {_ratio(runs, w, first, 'rate'):.2f}x "
            f"| {_med(runs, w, 'cpu_per_call') * 1e6:.0f} | {sum(c['recreated'] for c in checks):.0f} "
            f"| {sum(c['wrong'] for c in checks)} | {max(c['sessions'] for c in checks)} "
            f"| {sum(c['counted'] for c in checks)} / {sum(c['sent'] for c in checks)} |"
        )


def clients_on_every_worker(target: str, workers: int, tries: int = 64) -> list:
    """One tensorops.Client (of its own connection) per worker, opened until every worker
    answered one: GetServerInfo says which worker answers."""
    import tensorops

    found: dict = {}
    for _ in range(tries):
        c = tensorops.Client(target, max_message_bytes=MAX_MESSAGE, options=OWN_CONNECTION)
        worker = c.info().get("worker")
        if worker is None and workers > 1:
            c.close()
            break
        if worker in found:
            c.close()
        else:
            found[worker] = c
        if len(found) == workers:
            return list(found.values())
    for c in found.values():
        c.close()
    raise RuntimeError(f"no channel reached every one of the {workers} workers in {tries} tries")


def session_memory(servers: Servers, workers: int) -> dict:
    """The serving processes' summed PSS (and the supervisor's, and the shared state
    directory's bytes) before and after a session of a 64 MiB B is created through one
    worker and forwarded through every worker, whose results are checked against the
    in-process kernel. A server of its own, stopped after."""
    import tensorops_native as tn

    k, n = SESSION_MEMORY_K, SESSION_MEMORY_N
    server = servers.start(workers, False, "asyncio", "--max-session-bytes-per-caller", str(1 << 30))
    try:
        clients = clients_on_every_worker(server.target, workers)
        try:
            # warm up every worker's session path (small session) before the baseline
            b, params = qip_session_parameters(256, 256)
            warm = clients[0].quantized_inner_product(b, **params)
            for c in clients:
                shared = copy.copy(warm)
                shared._client = c
                shared.forward(np.zeros((1, 256), np.uint8))
            warm.close()
            time.sleep(1.0)

            def measure():
                supervisor = procfs.pss_bytes(server.pid) if server.pid not in server.serving else 0
                state = sum(procfs.dir_bytes(d) for d in procfs.state_dirs(procfs.process_tree(server.pid)))
                return sum(map(procfs.pss_bytes, server.serving)), supervisor, state

            before = measure()
            b, params = qip_session_parameters(k, n)
            a = np.random.default_rng(3).integers(0, 256, (1, k), dtype=np.uint8)
            with tn.QuantizedInnerProduct(b, **params) as reference:
                expected = reference.forward(a)
            session = clients[0].quantized_inner_product(b, **params)
            del b
            identical = True
            for c in clients:
                shared = copy.copy(session)
                shared._client = c
                identical &= bool(np.array_equal(shared.forward(a), expected))
            time.sleep(1.0)
            after = measure()
            session.close()
        finally:
            for c in clients:
                c.close()
    finally:
        servers.procs.remove(server.proc)
        stop(server.proc)
    return {"b": k * n, "before": before, "after": after, "identical": identical, "workers": workers}


def print_session_memory(rows: list[dict]) -> None:
    mib = 1 << 20
    print(
        f"\n## Session memory: one session of a {rows[0]['b'] // mib} MiB B "
        f"(int8 {SESSION_MEMORY_K} x {SESSION_MEMORY_N})\n"
    )
    print(
        "PSS (/proc/<pid>/smaps_rollup: private pages plus each shared page divided by the processes sharing it) "
        "summed over the processes that serve, before the session (every worker warmed up by a small one) and "
        "after it was created through one worker and forwarded once through every worker (results compared "
        "with the in-process kernel). Supervisor: its own PSS; state directory: the bytes of the files in the "
        "shared state directory (tmpfs pages count in a PSS only where mapped). Target: growth <= 1.2 x B.\n"
    )
    print(
        "| workers | workers' PSS before MiB | after MiB | growth MiB | growth / B | supervisor PSS growth MiB "
        "| state directory growth MiB | results identical |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        (pss0, sup0, dir0), (pss1, sup1, dir1) = row["before"], row["after"]
        print(
            f"| {row['workers']} | {pss0 / mib:.1f} | {pss1 / mib:.1f} | {(pss1 - pss0) / mib:.1f} "
            f"| {(pss1 - pss0) / row['b']:.2f} | {(sup1 - sup0) / mib:.1f} | {(dir1 - dir0) / mib:.1f} "
            f"| {'yes' if row['identical'] else 'NO'} |"
        )


# ---------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="layer_norm_channels", choices=sorted(OPERATIONS))
    p.add_argument("--sizes", default=",".join(SIZES), help="payload sizes, from " + ", ".join(SIZES))
    p.add_argument("--repeat", type=int, default=200, help="calls per size at 256 KB (scaled by size)")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--duration", type=float, default=3.0, help="seconds per throughput cell")
    p.add_argument(
        "--runs",
        type=int,
        default=None,
        help="times everything is measured; each cell is the median over the runs (default 3, 1 with --quick)",
    )
    p.add_argument("--only", default=",".join(PARTS), help="comma list of the parts to run: " + ", ".join(PARTS))
    p.add_argument(
        "--threads",
        type=int,
        default=max(4, 2 * (os.cpu_count() or 1)),
        help="threads of each tensorops server process and of the sync echo server",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="tensorops server processes for latency, throughput, kserve and batching (default 1, as the echo servers)",
    )
    p.add_argument(
        "--worker-counts",
        default="1,2",
        help="server processes compared by the workers, session-workers, uvloop and session-memory parts",
    )
    p.add_argument("--in-flight", default="4,16,64", help="calls in flight in the workers part")
    p.add_argument("--quick", action="store_true", help="few repeats, short cells, one run: to check it runs")
    p.add_argument(
        "--retain-freed-buffers",
        action="store_true",
        help="give this (client) process the server's malloc setting, "
        "tensorops.retain_freed_buffers(), for the echo and tensorops alike; by default the "
        "client runs as a user's would, with glibc malloc untouched",
    )
    p.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--serve-echo-aio", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_echo:
        serve_echo(args.threads)
        return
    if args.serve_echo_aio:
        serve_echo_aio()
        return
    if args.quick:
        args.repeat, args.duration = 10, 0.5
        args.sizes = args.sizes if args.sizes != ",".join(SIZES) else "4K,64K,1M"
    runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    if runs < 1:
        p.error("--runs must be >= 1")
    parts = [s.strip() for s in args.only.split(",") if s.strip()]
    if not parts or any(s not in PARTS for s in parts):
        p.error(f"--only: a comma list of {', '.join(PARTS)}")
    fname, kernels, _ = OPERATIONS[args.op]
    if not available(kernels):
        sys.exit(f"{args.op}: kernel not in this build ({', '.join(kernels)})")
    sizes = {s: SIZES[s] for s in args.sizes.split(",")}
    client_counts = [int(n) for n in args.clients.split(",")]
    worker_counts = [int(n) for n in args.worker_counts.split(",")]
    in_flight = [int(n) for n in args.in_flight.split(",")]
    if min(worker_counts + in_flight + client_counts) < 1 or args.workers < 1 or args.threads < 1:
        p.error("--workers, --threads, --worker-counts, --in-flight and --clients take numbers >= 1")
    import tensorops
    import tensorops_native as tn

    retained = tensorops.retain_freed_buffers() if args.retain_freed_buffers else False
    print(
        f"# tensorops RPC benchmark: ISA {tn.isa()}, {os.cpu_count()} CPUs, server workers {args.workers} "
        f"(worker parts: {', '.join(map(str, worker_counts))}), threads {args.threads}, "
        f"client malloc {'retaining freed buffers' if retained else 'default'}, {runs} "
        f"run{'s' if runs > 1 else ''}"
    )
    if "kserve" in parts and (not kserve_available() or "x" not in _arg_names(fname)):
        print("\n(kserve: needs tritonclient[grpc] and an operation with input x, skipped)")
        parts.remove("kserve")
    for part in ("batching", "session-workers", "session-memory"):
        if part in parts and not qip_available():
            print(f"\n({part}: no quantized inner product in this build, skipped)")
            parts.remove(part)
    if "uvloop" in parts and not uvloop_available():
        print("\n(uvloop: not installed, skipped)")
        parts.remove("uvloop")
    affinity = sorted(os.sched_getaffinity(0))
    # pinned cells: the client on one CPU, the server on another
    cpus = ({affinity[0]}, {affinity[1]}) if len(affinity) >= 2 else None
    pins = (False, True) if cpus else (False,)

    procs: list = []
    sessions: list = []
    results = collections.defaultdict(list)
    scratch = tempfile.mkdtemp(prefix="tensorops-bench-")
    servers = Servers(procs, args.threads, cpus[1] if cpus else None, scratch)
    try:
        echo_ports, pids, target = {}, {}, None
        if "latency" in parts or "throughput" in parts or "kserve" in parts:
            for kind in ("sync", "aio"):
                proc, echo_ports[kind] = start_echo(procs, args.threads, aio=kind == "aio")
                pids[kind] = proc.pid
            server = start_tensorops_server(
                procs,
                args.threads,
                "--allow-shared-memory",
                "true",
                "--shared-memory-prefix",
                "tensorops_bench_",
                workers=args.workers,
            )
            pids["tensorops"] = server.pid
            target = server.target
        batching_servers = {}
        if "batching" in parts:
            for mode, flags in (("off", ("--max-batch-rows", "1")), ("on", ())):
                server = start_tensorops_server(procs, args.threads, *flags, workers=args.workers, metrics=True)
                shared = SharedSession(server.target)
                sessions.append(shared)
                batching_servers[mode] = (shared, server.pid, server.metrics_port)
        load = LoadClients(args.op, cpus[0] if cpus else None, scratch)
        session_servers = {}
        if "session-workers" in parts:
            for workers in worker_counts:
                server = servers.get(workers)
                shared = SharedSession(server.target, OWN_CONNECTION)
                sessions.append(shared)
                session_servers[workers] = (shared, server)
        for run in range(runs):
            for part in PARTS:
                if part not in parts or part == "session-memory":
                    continue
                print(f"run {run + 1}/{runs}: {part}", file=sys.stderr, flush=True)
                if part == "latency":
                    results[part].append(latency_run(target, echo_ports, args.op, sizes, args.repeat))
                elif part == "throughput":
                    results[part].append(
                        throughput_run(target, echo_ports, pids, args.op, client_counts, args.duration)
                    )
                elif part == "kserve":
                    results[part].append(kserve_run(target, echo_ports["sync"], args.op, sizes, args.repeat))
                elif part == "batching":
                    results[part].append(batching_run(batching_servers, client_counts, args.duration))
                elif part == "workers":
                    results[part].append(workers_run(servers, load, worker_counts, in_flight, args.duration, pins))
                elif part == "session-workers":
                    results[part].append(session_workers_run(session_servers, SIDE_BY_SIDE_CALLS, args.duration))
                else:
                    results[part].append(uvloop_run(servers, load, worker_counts, SIDE_BY_SIDE_CALLS, args.duration))
        if "session-memory" in parts:
            print("session-memory", file=sys.stderr, flush=True)
            results["session-memory"] = [session_memory(servers, workers) for workers in worker_counts]
        if "latency" in parts:
            print_latency(args.op, sizes, results["latency"])
        if "throughput" in parts:
            print_throughput(results["throughput"], client_counts, args.duration, _server_workers(target))
        if "kserve" in parts:
            print_kserve(args.op, sizes, results["kserve"])
        if "batching" in parts:
            print_batching(results["batching"], client_counts, args.duration)
        if "workers" in parts:
            print_workers(args.op, results["workers"], worker_counts, in_flight, args.duration, pins, cpus)
        if "session-workers" in parts:
            print_session_workers(results["session-workers"], SIDE_BY_SIDE_CALLS, args.duration)
        if "uvloop" in parts:
            print_uvloop(args.op, results["uvloop"], worker_counts, SIDE_BY_SIDE_CALLS, args.duration)
        if "session-memory" in parts:
            print_session_memory(results["session-memory"])
    finally:
        for shared in sessions:
            try:
                shared.close()
            except Exception as exc:
                print(f"closing a session: {exc}", file=sys.stderr)
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
