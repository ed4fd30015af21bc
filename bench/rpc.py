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

Everything is measured --runs times (default 3, the servers stay up) and every printed cell
is the median over the runs (of per-run med for times; ratios are taken within a run).

    python bench/rpc.py                         # the full tables
    python bench/rpc.py --quick                 # a quick check that everything runs (1 run)
    python bench/rpc.py --only batching --runs 5

Times are wall-clock; always compare with the echo of the same run. No assertions.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent import futures
from dataclasses import dataclass
from functools import partial

import numpy as np

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
PARTS = ("latency", "throughput", "kserve", "batching")
AIO_IN_FLIGHT = 64
ECHO_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE)]


# ---------------------------------------------------------------------------------------
# Servers


def serve_echo(workers: int) -> None:
    """The sync echo server (run in a subprocess): prints its port, serves until stdin closes."""
    import grpc

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=ECHO_OPTIONS)
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


def start_echo(procs: list, workers: int, aio: bool = False):
    """(process, port) of an echo server; the process is added to `procs` at once."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-echo-aio" if aio else "--serve-echo", "--workers", str(workers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    line = proc.stdout.readline()
    if not line.strip():
        raise RuntimeError(f"the {'aio' if aio else 'sync'} echo server did not start")
    return proc, int(line)


def start_tensorops_server(procs: list, workers: int, *flags: str, metrics: bool = False):
    """(process, port, metrics port or None) of a tensorops-server; added to `procs` at once."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorops_server",
            "--port",
            "0",
            "--metrics-port",
            "0" if metrics else "-1",
            "--workers",
            str(workers),
            "--max-message-bytes",
            str(MAX_MESSAGE),
            "--max-tensor-bytes",
            str(MAX_MESSAGE),
            *flags,
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    procs.append(proc)
    seen = []
    for line in proc.stderr:
        try:
            event = json.loads(line)
        except ValueError:
            seen.append(line)
            continue
        if event.get("event") == "serving":
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining the logs
            return proc, event["port"], event.get("metrics_port")
        seen.append(line)
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


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()  # fields 3.. (the name may hold spaces)
    except OSError:
        return float("nan")
    return (int(after_name[11]) + int(after_name[12])) / _TICKS  # fields 14 and 15


def batch_histogram(metrics_port: int) -> tuple[float, float]:
    """(sum, count) of the server's tensorops_forward_batch_requests histogram."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("tensorops_forward_batch_requests_sum", "tensorops_forward_batch_requests_count"):
            values[name.rsplit("_", 1)[1]] = float(value)
    return values.get("sum", 0.0), values.get("count", 0.0)


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


def _cell(calls: int, elapsed: float, cpu: float, latencies, batch=float("nan")) -> Cell:
    p50, p99 = np.percentile(latencies, [50, 99]) if len(latencies) else (float("nan"),) * 2
    return Cell(calls / elapsed, cpu / calls if calls else float("nan"), cpu / elapsed, float(p50), float(p99), batch)


def throughput(make_call, clients: int, duration: float, pid: int, metrics_port: int | None = None) -> Cell:
    """`clients` threads, each with its own call (and channel), calling for `duration` s;
    the server process `pid`'s CPU time is read around the cell."""
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
        cpu0 = cpu_seconds(pid)
        begin = time.perf_counter()
        go.set()
        stop_event.wait(duration)
        stop_event.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - begin
        cpu = cpu_seconds(pid) - cpu0
        if errors:
            raise errors[0]
        batch = float("nan")
        if batch0 is not None:
            s, n = batch_histogram(metrics_port)
            batch = (s - batch0[0]) / (n - batch0[1]) if n > batch0[1] else float("nan")
        all_times = [x for t in latencies for x in t]
        return _cell(len(all_times), elapsed, cpu, all_times, batch)
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
            cpu0 = cpu_seconds(pid)
            begin = time.perf_counter()
            deadline = begin + duration

            async def worker():
                while time.perf_counter() < deadline:
                    start = time.perf_counter()
                    await fn(*args, **kwargs)
                    times.append(time.perf_counter() - start)

            await asyncio.gather(*(worker() for _ in range(in_flight)))
            elapsed = time.perf_counter() - begin
            return _cell(len(times), elapsed, cpu_seconds(pid) - cpu0, times)

    return asyncio.run(run())


def throughput_workloads(target: str, echo_ports: dict, op_name: str):
    """[(label, kind, make_call)]; kind names the server: 'sync', 'aio' or 'tensorops'."""
    import tensorops

    fname, _, build = OPERATIONS[op_name]
    small_args, small_kwargs = build(64 << 10)
    small_request = _request_bytes(fname, small_args, small_kwargs)
    workloads = []
    for kind in ("sync", "aio"):

        def echo_call(port=echo_ports[kind]):
            channel, echo = _echo_channel(port)
            return (lambda: echo(small_request)), channel.close

        workloads.append((f"{kind} echo 64 KB", kind, echo_call))

    def op_call():
        c = tensorops.Client(target, max_message_bytes=MAX_MESSAGE)
        fn = getattr(c, fname)
        return (lambda: fn(*small_args, **small_kwargs)), c.close

    workloads.append((f"{op_name} 64 KB", "tensorops", op_call))

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
        "server process over the cell; 'cores' is CPU seconds per second.\n"
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
    """One quantized inner-product session (B 1024 x 1024 int8) on a server, opened once on
    its own client; every client thread gets its own channel forwarding to this session."""

    def __init__(self, target: str):
        import tensorops

        self.target = target
        b, params = qip_session_parameters()
        self.owner = tensorops.Client(target, max_message_bytes=MAX_MESSAGE)
        try:
            self.session = self.owner.quantized_inner_product(b, **params)
        except BaseException:
            self.owner.close()
            raise
        self.a = np.random.default_rng(1).integers(0, 256, (1, b.shape[0]), dtype=np.uint8)

    def make_call(self):
        import tensorops

        c = tensorops.Client(self.target, max_message_bytes=MAX_MESSAGE)
        # the same session (same id, same state) bound to this thread's own client and
        # channel; never closed itself: that would release the shared session
        s = copy.copy(self.session)
        s._client = c
        return (lambda: s.forward(self.a)), c.close

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
    p.add_argument("--workers", type=int, default=max(4, 2 * (os.cpu_count() or 1)))
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
        serve_echo(args.workers)
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
    import tensorops
    import tensorops_native as tn

    retained = tensorops.retain_freed_buffers() if args.retain_freed_buffers else False
    print(
        f"# tensorops RPC benchmark: ISA {tn.isa()}, {os.cpu_count()} CPUs, server workers {args.workers}, "
        f"client malloc {'retaining freed buffers' if retained else 'default'}, {runs} "
        f"run{'s' if runs > 1 else ''}"
    )
    if "kserve" in parts and (not kserve_available() or "x" not in _arg_names(fname)):
        print("\n(kserve: needs tritonclient[grpc] and an operation with input x, skipped)")
        parts.remove("kserve")
    if "batching" in parts and not qip_available():
        print("\n(batching: no quantized inner product in this build, skipped)")
        parts.remove("batching")

    procs: list = []
    sessions: list = []
    results = collections.defaultdict(list)
    try:
        echo_ports, pids, target = {}, {}, None
        if "latency" in parts or "throughput" in parts or "kserve" in parts:
            for kind in ("sync", "aio"):
                proc, echo_ports[kind] = start_echo(procs, args.workers, aio=kind == "aio")
                pids[kind] = proc.pid
            proc, port, _ = start_tensorops_server(
                procs, args.workers, "--allow-shared-memory", "true", "--shared-memory-prefix", "tensorops_bench_"
            )
            pids["tensorops"] = proc.pid
            target = f"127.0.0.1:{port}"
        batching_servers = {}
        if "batching" in parts:
            for mode, flags in (("off", ("--max-batch-rows", "1")), ("on", ())):
                proc, port, metrics_port = start_tensorops_server(procs, args.workers, *flags, metrics=True)
                shared = SharedSession(f"127.0.0.1:{port}")
                sessions.append(shared)
                batching_servers[mode] = (shared, proc.pid, metrics_port)
        for run in range(runs):
            for part in PARTS:
                if part not in parts:
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
                else:
                    results[part].append(batching_run(batching_servers, client_counts, args.duration))
        if "latency" in parts:
            print_latency(args.op, sizes, results["latency"])
        if "throughput" in parts:
            print_throughput(results["throughput"], client_counts, args.duration, _server_workers(target))
        if "kserve" in parts:
            print_kserve(args.op, sizes, results["kserve"])
        if "batching" in parts:
            print_batching(results["batching"], client_counts, args.duration)
    finally:
        for shared in sessions:
            try:
                shared.close()
            except Exception as exc:
                print(f"closing a session: {exc}", file=sys.stderr)
        for proc in reversed(procs):
            stop(proc)


if __name__ == "__main__":
    main()
