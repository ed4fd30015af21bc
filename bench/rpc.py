"""RPC overhead of the tensorops service against the floor: a raw-bytes gRPC echo.

Starts `tensorops-server` and an echo server (grpcio, same stack, bytes in -> the same bytes
out) as subprocesses on loopback, then prints

1. latency: for payloads from 4 KB to 16 MB, the median time of one operation through
   tensorops.Client and of an echo of a message of the same size, their ratio, the
   in-process kernel time, and the ratio to echo + kernel;
2. throughput with 1, 4 and 16 concurrent clients (threads, one channel each), for the
   same operation on a small tensor and for a kernel heavier than its transfer.

    python bench/rpc.py                 # the full tables
    python bench/rpc.py --quick         # a quick check that everything runs

Times are wall-clock medians; always compare with the echo of the same run. No assertions.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures

import numpy as np

ECHO_METHOD = "/bench.Echo/Echo"
MAX_MESSAGE = 256 * 1024 * 1024
SIZES = {"4K": 4 << 10, "16K": 16 << 10, "64K": 64 << 10, "256K": 256 << 10, "1M": 1 << 20, "4M": 4 << 20,
         "16M": 16 << 20}


# ---------------------------------------------------------------------------------------
# Servers

def serve_echo(workers: int) -> None:
    """The echo server (run in a subprocess): prints its port, serves until stdin closes."""
    import grpc

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda request, context: request)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                  ("grpc.max_send_message_length", MAX_MESSAGE)])
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


def start_echo(workers: int):
    proc = subprocess.Popen([sys.executable, __file__, "--serve-echo", "--workers", str(workers)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def start_tensorops_server(workers: int):
    proc = subprocess.Popen([sys.executable, "-m", "tensorops_server", "--port", "0", "--metrics-port", "-1",
                             "--workers", str(workers), "--max-message-bytes", str(MAX_MESSAGE),
                             "--max-tensor-bytes", str(MAX_MESSAGE)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in proc.stderr:
        event = json.loads(line)
        if event.get("event") == "serving":
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining the logs
            return proc, event["port"]
    raise RuntimeError("tensorops-server did not start")


def stop(proc) -> None:
    if proc.stdin:
        proc.stdin.close()
    proc.terminate()
    proc.wait(30)


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
    "softmax": ("softmax", ("SynetSoftmax32f",),
                lambda n: ((np.random.default_rng(0).standard_normal((max(1, n // 4096), 1024)).astype(np.float32),),
                           {})),
    "unary": ("unary", ("SynetUnaryOperation32f",),
              lambda n: ((np.random.default_rng(0).standard_normal(max(1, n // 4)).astype(np.float32), "neg"), {})),
    "eltwise": ("eltwise", ("SynetEltwiseLayerForward",),
                lambda n: (([np.ones(max(1, n // 8), np.float32)] * 2, "sum"), {})),
}


def available(kernels) -> bool:
    import tensorops_native as tn
    report = tn.kernels()
    return all(report.get(k, "missing") != "missing" for k in kernels)


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


def latency_table(target: str, echo_port: int, op_name: str, sizes: dict, base_repeat: int) -> None:
    import grpc

    import tensorops
    import tensorops_native as tn
    from tensorops import _wire

    fname, _, build = OPERATIONS[op_name]
    print(f"\n## Latency: {op_name} through tensorops.Client vs raw-bytes echo (medians)\n")
    print("| payload | echo ms | client ms | client / echo | kernel ms | client / (echo + kernel) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    with tensorops.Client(target, max_message_bytes=MAX_MESSAGE) as client, \
            grpc.insecure_channel(f"127.0.0.1:{echo_port}", options=[
                ("grpc.max_send_message_length", MAX_MESSAGE),
                ("grpc.max_receive_message_length", MAX_MESSAGE)]) as channel:
        echo = channel.unary_unary(ECHO_METHOD, _registered_method=True)
        fn = getattr(client, fname)
        native = getattr(tn, fname)
        for label, nbytes in sizes.items():
            args, kwargs = build(nbytes)
            request = _wire.build_request(_wire.OPERATIONS[fname], dict(zip(_arg_names(fname), args), **kwargs)).data
            repeat = repeats_for(nbytes, base_repeat)
            # alternate short runs of each, so drifts of the machine hit both alike while
            # each side runs as it would in a loop of its own calls
            t_echo, t_call = [], []
            block = max(1, min(10, repeat // 10))
            for _ in range(2):
                echo(request)
                fn(*args, **kwargs)
            for _ in range(0, repeat, block):
                for _ in range(block):
                    start = time.perf_counter()
                    echo(request)
                    t_echo.append(time.perf_counter() - start)
                for _ in range(block):
                    start = time.perf_counter()
                    fn(*args, **kwargs)
                    t_call.append(time.perf_counter() - start)
            e, c = statistics.median(t_echo), statistics.median(t_call)
            k = median_time(lambda: native(*args, **kwargs), repeat)
            print(f"| {label} | {e * 1e3:.3f} | {c * 1e3:.3f} | {c / e:.2f} | {k * 1e3:.3f} | {c / (e + k):.2f} |",
                  flush=True)


def _arg_names(fname: str) -> list[str]:
    import inspect

    import tensorops_native as tn
    return [p for p in inspect.signature(getattr(tn, fname)).parameters]


def throughput(make_call, clients: int, duration: float) -> float:
    """Calls per second of `clients` threads, each with its own call (and channel)."""
    calls = [make_call() for _ in range(clients)]
    counts = [0] * clients
    stop = threading.Event()
    start_barrier = threading.Barrier(clients + 1)

    def worker(i):
        call, _ = calls[i]
        call()  # warm up the channel
        start_barrier.wait()
        while not stop.is_set():
            call()
            counts[i] += 1
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start_barrier.wait()
    begin = time.perf_counter()
    time.sleep(duration)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - begin
    for _, close in calls:
        close()
    return sum(counts) / elapsed


def throughput_table(target: str, echo_port: int, op_name: str, client_counts, duration: float) -> None:
    import grpc

    import tensorops
    from tensorops import _wire

    fname, _, build = OPERATIONS[op_name]
    small_args, small_kwargs = build(64 << 10)
    small_request = _wire.build_request(_wire.OPERATIONS[fname],
                                        dict(zip(_arg_names(fname), small_args), **small_kwargs)).data
    workloads = []

    def echo_call():
        channel = grpc.insecure_channel(f"127.0.0.1:{echo_port}")
        echo = channel.unary_unary(ECHO_METHOD, _registered_method=True)
        return (lambda: echo(small_request)), channel.close
    workloads.append(("echo 64 KB", echo_call))

    def op_call():
        c = tensorops.Client(target, max_message_bytes=MAX_MESSAGE)
        fn = getattr(c, fname)
        return (lambda: fn(*small_args, **small_kwargs)), c.close
    workloads.append((f"{op_name} 64 KB", op_call))

    heavy = heavy_workload(target)
    if heavy is not None:
        workloads.append(heavy)
    print(f"\n## Throughput (calls/s), {duration:g} s per cell; server workers = {_server_workers(target)}\n")
    print("| workload | " + " | ".join(f"{n} client{'s' if n > 1 else ''}" for n in client_counts) +
          f" | {client_counts[-1]} vs 1 |")
    print("| --- | " + " | ".join("---:" for _ in client_counts) + " | ---: |")
    for label, make in workloads:
        rates = [throughput(make, n, duration) for n in client_counts]
        print(f"| {label} | " + " | ".join(f"{r:.0f}" for r in rates) + f" | {rates[-1] / rates[0]:.2f}x |",
              flush=True)


def _server_workers(target: str) -> int:
    import tensorops
    with tensorops.Client(target) as c:
        return c.info()["workers"]


def heavy_workload(target: str):
    """A kernel heavier than its transfer: a quantized inner-product session forward
    (M x K x N multiply-adds for M x K bytes in, M x N out), else unary tanh."""
    import tensorops
    import tensorops_native as tn

    rng = np.random.default_rng(0)
    if hasattr(tn, "QuantizedInnerProduct") and all(v != "missing" for k, v in tn.kernels().items() if "Quantized" in k):
        m, k, n = 64, 1024, 1024
        b = rng.integers(-128, 128, (k, n), dtype=np.int8)
        a = rng.integers(0, 256, (m, k), dtype=np.uint8)
        params = dict(b_scale=np.full(n, 0.01, np.float32), a_scale=0.05, a_zero=3, c_scale=0.5, c_zero=1)

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="layer_norm_channels", choices=sorted(OPERATIONS))
    p.add_argument("--sizes", default=",".join(SIZES), help="payload sizes, from " + ", ".join(SIZES))
    p.add_argument("--repeat", type=int, default=200, help="calls per size at 256 KB (scaled by size)")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--duration", type=float, default=3.0, help="seconds per throughput cell")
    p.add_argument("--workers", type=int, default=max(4, 2 * (os.cpu_count() or 1)))
    p.add_argument("--quick", action="store_true", help="few repeats and short cells, to check it runs")
    p.add_argument("--plain-malloc", action="store_true",
                   help="leave glibc malloc as it is in this (client) process; by default it gets the "
                        "server's setting, tensorops.retain_freed_buffers(), for the echo and tensorops alike")
    p.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_echo:
        serve_echo(args.workers)
        return
    if args.quick:
        args.repeat, args.duration = 10, 0.5
        args.sizes = args.sizes if args.sizes != ",".join(SIZES) else "4K,64K,1M"
    fname, kernels, _ = OPERATIONS[args.op]
    if not available(kernels):
        sys.exit(f"{args.op}: kernel not in this build ({', '.join(kernels)})")
    sizes = {s: SIZES[s] for s in args.sizes.split(",")}
    import tensorops
    import tensorops_native as tn
    retained = False if args.plain_malloc else tensorops.retain_freed_buffers()
    print(f"# tensorops RPC benchmark: ISA {tn.isa()}, {os.cpu_count()} CPUs, server workers {args.workers}, "
          f"client malloc {'retaining freed buffers' if retained else 'default'}")
    echo_proc, echo_port = start_echo(args.workers)
    server_proc, port = start_tensorops_server(args.workers)
    try:
        target = f"127.0.0.1:{port}"
        latency_table(target, echo_port, args.op, sizes, args.repeat)
        throughput_table(target, echo_port, args.op, [int(n) for n in args.clients.split(",")], args.duration)
    finally:
        stop(server_proc)
        stop(echo_proc)


if __name__ == "__main__":
    main()
