"""Run by .ci/install-orders with the interpreter of an environment holding tensorops and
tritonclient[grpc]: the installed tensorops-server starts on a loopback port and answers a
softmax from the tensorops SDK and from tritonclient; then SIGTERM stops it cleanly."""

import json
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import tritonclient.grpc as triton

import tensorops

server_program = sys.argv[1]
x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
expected = np.exp(x - x.max(axis=1, keepdims=True))
expected /= expected.sum(axis=1, keepdims=True)

with tempfile.TemporaryFile("w+") as log:
    server = subprocess.Popen(
        [server_program, "--host", "127.0.0.1", "--port", "0", "--metrics-port=-1"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None:
            if server.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                sys.exit(f"FAIL: the server did not start (exit status {server.poll()}):\n{log.read()}")
            time.sleep(0.1)
            log.seek(0)
            for line in log:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "serving":
                    port = event["port"]
        target = f"127.0.0.1:{port}"
        with tensorops.Client(target) as client:
            np.testing.assert_allclose(client.softmax(x, axis=1), expected, rtol=1e-5)
        with triton.InferenceServerClient(target) as kserve:
            assert kserve.is_server_live()
            given = triton.InferInput("x", list(x.shape), "FP32")
            given.set_data_from_numpy(x)
            result = kserve.infer("softmax", [given], parameters={"axis": 1}).as_numpy("y")
            np.testing.assert_allclose(result, expected, rtol=1e-5)
    finally:
        server.send_signal(signal.SIGTERM)
        status = server.wait(60)
    if status != 0:
        log.seek(0)
        sys.exit(f"FAIL: the server exited with {status} after SIGTERM:\n{log.read()}")
print(f"server on {target} answered tensorops and tritonclient, stopped cleanly")
