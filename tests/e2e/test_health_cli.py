"""`tensorops-health` (the container HEALTHCHECK command) against real server processes:
exit 0 and SERVING from a serving server, exit 1 with the reason otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import trustme

from rpc_server import LongCall, free_port

HEALTH = shutil.which("tensorops-health", path=str(Path(sys.executable).parent)) or "tensorops-health"


def health(*args, env=None, timeout=30):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TENSOROPS_")}
    environ.update(env or {})
    return subprocess.run([HEALTH, *args], capture_output=True, text=True, env=environ, timeout=timeout)


def test_serving_server(server):
    r = health("--address", server.target)
    assert (r.returncode, r.stdout.strip()) == (0, f"{server.target}: SERVING"), r
    r = health("--address", server.target, "--service", "tensorops.v1.TensorOps", "--timeout", "5")
    assert r.returncode == 0 and r.stdout.strip().endswith("tensorops.v1.TensorOps: SERVING"), r


def test_address_from_the_environment(server):
    r = health(env={"TENSOROPS_HEALTH_ADDRESS": server.target})
    assert r.returncode == 0 and "SERVING" in r.stdout, r
    # Without an address: localhost on the server's own port variable.
    r = health(env={"TENSOROPS_PORT": str(server.port)})
    assert (r.returncode, r.stdout.strip()) == (0, f"localhost:{server.port}: SERVING"), r
    # A flag wins over the variable.
    r = health("--address", server.target, env={"TENSOROPS_HEALTH_ADDRESS": f"127.0.0.1:{free_port()}"})
    assert r.returncode == 0, r


def test_unknown_service_is_not_healthy(server):
    r = health("--address", server.target, "--service", "no.such.Service")
    assert r.returncode == 1 and "NOT_FOUND" in r.stdout, r


def test_nothing_listening():
    started = time.monotonic()
    r = health("--address", f"127.0.0.1:{free_port()}", "--timeout", "5")
    assert r.returncode == 1 and "UNAVAILABLE" in r.stdout, r
    assert time.monotonic() - started < 5  # refused at once, not after the timeout


def test_usage_errors():
    assert health("--timeout", "0").returncode == 2
    assert health("--cert", "c.pem").returncode == 2
    r = health("--ca", "/nonexistent/ca.pem")
    assert r.returncode == 2 and "cannot read" in r.stderr, r


def test_draining_server_is_not_healthy(start_server):
    """After SIGTERM, while a call still runs, health checks fail (the balancer and the
    orchestrator stop sending traffic) and the call in flight completes."""
    srv = start_server("--grace", "30", "--threads", "2")
    assert health("--address", srv.target).returncode == 0
    long_call = LongCall(srv, rows=6144)  # a second or more: still running after the health check
    srv.signal()
    deadline = time.monotonic() + 10
    while "draining" not in [e.get("event") for e in srv.events()]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    r = health("--address", srv.target, "--timeout", "2")
    long_call.join()
    assert r.returncode == 1, r
    assert "SERVING" not in r.stdout.replace("NOT_SERVING", ""), r
    assert long_call.errors == [] and len(long_call.result) == 1
    assert srv.wait(30) == 0


def test_tls(start_server, tmp_path):
    ca = trustme.CA()
    leaf = ca.issue_cert("localhost", "127.0.0.1")
    cert, key, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())
    ca.cert_pem.write_to_path(str(ca_file))
    srv = start_server("--tls-cert", str(cert), "--tls-key", str(key))
    r = health("--address", srv.target, "--ca", str(ca_file))
    assert r.returncode == 0 and "SERVING" in r.stdout, r
    r = health(env={"TENSOROPS_HEALTH_ADDRESS": f"localhost:{srv.port}", "TENSOROPS_HEALTH_CA": str(ca_file)})
    assert r.returncode == 0, r
    assert health("--address", srv.target).returncode == 1  # plaintext to a TLS port
    assert health("--address", srv.target, "--tls").returncode == 1  # system roots do not know this CA
