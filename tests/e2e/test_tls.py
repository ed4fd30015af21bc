"""TLS, mutual TLS and certificate rotation against real servers on loopback, with
certificates made by trustme."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

import tensorops
import tensorops.aio
import tensorops_native as tn
from rpc_cases import same
from rpc_server import metric_value

CALL_TIMEOUT = 10
# Every client gets its own connections: a new client means a new TLS handshake (gRPC
# otherwise shares subchannels between channels with equal arguments).
OWN_CONNECTIONS = [("grpc.use_local_subchannel_pool", 1)]
# PEM files are padded to this size with newlines (ignored by PEM parsers), so that a
# rewrite in place can keep size and modification time: only SIGHUP then reloads it.
PADDED_SIZE = 4096


@pytest.fixture(scope="module")
def pki():
    """Two unrelated CAs, a server certificate from each (for localhost and 127.0.0.1)
    and a client certificate from each."""
    ca1, ca2 = trustme.CA(), trustme.CA()
    return {
        "ca1": ca1,
        "ca2": ca2,
        "server1": ca1.issue_cert("localhost", "127.0.0.1"),
        "server2": ca2.issue_cert("localhost", "127.0.0.1"),
        "client1": ca1.issue_cert("client-one.example"),
        "client2": ca2.issue_cert("client-two.example"),
    }


def chain(leaf: trustme.LeafCert) -> bytes:
    return b"".join(blob.bytes() for blob in leaf.cert_chain_pems)


def padded(data: bytes) -> bytes:
    assert len(data) <= PADDED_SIZE
    return data + b"\n" * (PADDED_SIZE - len(data))


def install(directory, leaf: trustme.LeafCert) -> tuple[str, str]:
    """Write the leaf's chain and key as cert.pem and key.pem, each replaced atomically
    (key first: in between the pair does not match, which the server must ride out)."""
    paths = []
    for name, data in (("key.pem", leaf.private_key_pem.bytes()), ("cert.pem", chain(leaf))):
        tmp = directory / (name + ".tmp")
        tmp.write_bytes(padded(data))
        os.replace(tmp, directory / name)
        paths.append(str(directory / name))
    return paths[1], paths[0]


def tls_flags(cert: str, key: str, client_ca=None) -> list[str]:
    flags = ["--tls-cert", cert, "--tls-key", key]
    return flags + (["--tls-client-ca", str(client_ca)] if client_ca else [])


def ca_file(directory, ca: trustme.CA, name: str) -> str:
    path = directory / name
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def tls_client(srv, ca=None, client=None, **kwargs) -> tensorops.Client:
    """A client with its own connection; `ca` and `client` as trustme objects."""
    if ca is not None:
        kwargs["root_certificates"] = ca.cert_pem.bytes()
    if client is not None:
        kwargs.update(certificate_chain=chain(client), private_key=client.private_key_pem.bytes())
    return tensorops.Client(srv.target, timeout=CALL_TIMEOUT, max_attempts=1, options=OWN_CONNECTIONS, **kwargs)


def layer_norm_case():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    scale = (rng.random(5) + 0.5).astype(np.float32)
    shift = rng.standard_normal(5).astype(np.float32)
    return (x, scale, shift), tn.layer_norm_channels(x, scale, shift)


def works(srv, **kwargs) -> bool:
    """Whether a new client gets a correct answer (False when the connection is refused)."""
    args, expected = layer_norm_case()
    with tls_client(srv, **kwargs) as c:
        try:
            return same(expected, c.layer_norm_channels(*args))
        except tensorops.UnavailableError:
            return False


def events(srv, name: str) -> list[dict]:
    return [e for e in srv.events() if e.get("event") == name]


def eventually(condition, timeout: float = CALL_TIMEOUT) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def tls_server(tmp_path, pki, start_server):
    """A server with CA 1's server certificate, and the directory of its files."""
    cert, key = install(tmp_path, pki["server1"])
    return start_server(*tls_flags(cert, key)), tmp_path


# ---- TLS


def test_tls_results_bit_identical(tls_server, pki, run_async):
    srv, _ = tls_server
    args, expected = layer_norm_case()
    with tls_client(srv, pki["ca1"]) as c:
        assert same(expected, c.layer_norm_channels(*args))

    async def call(c):
        return await c.layer_norm_channels(*args)

    got = run_async(srv.target, call, root_certificates=pki["ca1"].cert_pem.bytes(), options=OWN_CONNECTIONS)
    assert same(expected, got)


def test_tls_root_certificates_from_a_path(tls_server, pki, tmp_path):
    srv, _ = tls_server
    path = tmp_path / "ca1.pem"
    pki["ca1"].cert_pem.write_to_path(str(path))
    for root in (path, str(path)):
        with tls_client(srv, root_certificates=root) as c:
            assert c.info()["version"] == tn.__version__


def test_tls_refuses_plaintext_and_an_unknown_ca(tls_server, pki):
    srv, _ = tls_server
    assert not works(srv)  # plaintext channel
    assert not works(srv, ca=pki["ca2"])  # the server's certificate is not from this CA
    assert works(srv, ca=pki["ca1"])


def test_server_name_override(tmp_path, pki, start_server):
    leaf = pki["ca1"].issue_cert("tensorops.test")
    srv = start_server(*tls_flags(*install(tmp_path, leaf)))
    assert not works(srv, ca=pki["ca1"])  # 127.0.0.1 is not a name in the certificate
    assert works(srv, ca=pki["ca1"], server_name_override="tensorops.test")


def test_health_and_metrics_under_tls(tls_server, pki):
    srv, _ = tls_server
    creds = grpc.ssl_channel_credentials(pki["ca1"].cert_pem.bytes())
    with grpc.secure_channel(srv.target, creds, options=OWN_CONNECTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "tensorops.v1.TensorOps"):
            assert (
                stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT).status
                == health_pb2.HealthCheckResponse.SERVING
            )
    with tls_client(srv, pki["ca1"]) as c:
        c.softmax(np.zeros((0, 4), np.float32))
    text = srv.metrics_text()  # the Prometheus endpoint stays plain HTTP
    assert metric_value(text, "tensorops_request_duration_seconds_count", operation="softmax", code="OK") == 1


# ---- mutual TLS


@pytest.fixture
def mtls_server(tmp_path, pki, start_server):
    """Mutual TLS configured through the environment: client certificates from CA 1."""
    cert, key = install(tmp_path, pki["server1"])
    env = {
        "TENSOROPS_TLS_CERT": cert,
        "TENSOROPS_TLS_KEY": key,
        "TENSOROPS_TLS_CLIENT_CA": ca_file(tmp_path, pki["ca1"], "clients.pem"),
    }
    srv = start_server(env=env)
    srv.directory = tmp_path
    return srv


def test_mtls_requires_a_client_certificate(mtls_server, pki):
    assert not works(mtls_server, ca=pki["ca1"])


def test_mtls_accepts_a_certificate_from_the_client_ca(mtls_server, pki, run_async):
    assert works(mtls_server, ca=pki["ca1"], client=pki["client1"])
    client = pki["client1"]

    async def call(c):
        return (await c.info())["version"]

    assert (
        run_async(
            mtls_server.target,
            call,
            root_certificates=pki["ca1"].cert_pem.bytes(),
            certificate_chain=chain(client),
            private_key=client.private_key_pem.bytes(),
            options=OWN_CONNECTIONS,
        )
        == tn.__version__
    )


def test_mtls_refuses_a_certificate_from_another_ca(mtls_server, pki):
    assert not works(mtls_server, ca=pki["ca1"], client=pki["client2"])


def test_mtls_client_ca_rotation(mtls_server, pki):
    os.replace(ca_file(mtls_server.directory, pki["ca2"], "clients.tmp"), mtls_server.directory / "clients.pem")
    assert works(mtls_server, ca=pki["ca1"], client=pki["client2"])
    assert not works(mtls_server, ca=pki["ca1"], client=pki["client1"])


# ---- rotation


def test_rotation_by_replacing_the_files(tls_server, pki):
    srv, directory = tls_server
    args, expected = layer_norm_case()
    with tls_client(srv, pki["ca1"]) as old:
        assert same(expected, old.layer_norm_channels(*args))
        install(directory, pki["server2"])
        assert works(srv, ca=pki["ca2"])  # a new connection gets certificate B
        assert not works(srv, ca=pki["ca1"])  # ... and no longer certificate A
        assert same(expected, old.layer_norm_channels(*args))  # the open connection carries on
    assert eventually(lambda: events(srv, "tls reloaded"))
    reloaded = events(srv, "tls reloaded")
    assert reloaded[-1]["cert"].endswith("cert.pem") and reloaded[-1]["changed"]


def test_rotation_on_sighup(tmp_path, pki, start_server):
    """Files rewritten in place with the same size and modification time look unchanged;
    SIGHUP makes the next handshake read them anyway. One process, whose reloads this test
    counts (every worker of several reloads: test_workers.py)."""
    directory = tmp_path
    srv = start_server(*tls_flags(*install(directory, pki["server1"])), "--workers", "1")
    for name, data in (("cert.pem", chain(pki["server2"])), ("key.pem", pki["server2"].private_key_pem.bytes())):
        path = directory / name
        before = path.stat()
        with open(path, "r+b") as f:
            f.write(padded(data))
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert path.stat().st_size == before.st_size
    assert works(srv, ca=pki["ca1"])  # not noticed yet
    srv.signal(signal.SIGHUP)  # delivered asynchronously: try until it is seen
    assert eventually(lambda: works(srv, ca=pki["ca2"]))
    assert not works(srv, ca=pki["ca1"])
    reloaded = events(srv, "tls reloaded")
    assert len(reloaded) == 1 and reloaded[0]["forced"] and reloaded[0]["changed"]
    srv.signal(signal.SIGHUP)  # nothing changed: reloaded again, the same certificate
    assert eventually(lambda: works(srv, ca=pki["ca2"]) and len(events(srv, "tls reloaded")) == 2)
    assert [e["changed"] for e in events(srv, "tls reloaded")] == [True, False]
    assert srv.proc.poll() is None


def test_unusable_files_keep_the_current_certificate(tls_server, pki):
    srv, directory = tls_server
    # Half a rotation: B's key with A's certificate.
    (directory / "key.tmp").write_bytes(pki["server2"].private_key_pem.bytes())
    os.replace(directory / "key.tmp", directory / "key.pem")
    assert works(srv, ca=pki["ca1"])
    # A truncated certificate.
    (directory / "cert.tmp").write_bytes(chain(pki["server2"])[:100])
    os.replace(directory / "cert.tmp", directory / "cert.pem")
    assert works(srv, ca=pki["ca1"])
    # A missing file.
    os.remove(directory / "cert.pem")
    assert works(srv, ca=pki["ca1"])
    warnings = [e for e in srv.events() if e.get("level") == "warning" and e["event"].startswith("tls files")]
    assert len(warnings) == 3, warnings
    assert "do not match" in warnings[0]["error"] and "No such file" in warnings[2]["error"]
    # The rotation completes.
    install(directory, pki["server2"])
    assert works(srv, ca=pki["ca2"])
    assert srv.proc.poll() is None


# ---- startup errors


def start_failures(tmp_path, *flag_lists: list[str]) -> list[str]:
    """Run servers that must not start, all at once (each spends its time importing); their
    logs, in order."""
    started = []
    for i, flags in enumerate(flag_lists):
        log = tmp_path / f"failed{i}.log"
        with open(log, "w") as out:
            started.append(
                (
                    log,
                    subprocess.Popen(
                        [sys.executable, "-m", "tensorops_server", "--port", "0", "--metrics-port", "-1", *flags],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    ),
                )
            )
    logs = []
    for log, proc in started:
        returncode = proc.wait(60)
        text = log.read_text()
        assert returncode != 0 and "cannot start" in text, text
        logs.append(text)
    return logs


def test_startup_errors(tmp_path, pki):
    cert, key = install(tmp_path, pki["server1"])
    other_key = tmp_path / "other.pem"
    other_key.write_bytes(pki["server2"].private_key_pem.bytes())
    cases = [
        (["--tls-cert", cert], "--tls-key"),
        (["--tls-key", key], "--tls-cert"),
        (["--tls-client-ca", cert], "--tls-cert"),
        (tls_flags(cert, str(tmp_path / "missing.pem")), "missing.pem"),
        (tls_flags(cert, str(other_key)), "do not match"),
        (tls_flags(cert, key, other_key), "client CA"),
    ]
    logs = start_failures(tmp_path, *(flags for flags, _ in cases))
    for (flags, named), log in zip(cases, logs, strict=True):
        assert named in log, (flags, log)


def test_mtls_sessions_belong_to_the_certificate_subject(mtls_server, pki):
    """Without tokens, the client certificate names the caller: a session made with one
    certificate is invisible to another one from the same CA."""
    from rpc_cases import qip_params

    other = pki["ca1"].issue_cert("client-three.example")
    rng = np.random.default_rng(9)
    b = rng.integers(-128, 128, (16, 8), dtype=np.int8)
    p = qip_params(rng, 8)
    with (
        tls_client(mtls_server, ca=pki["ca1"], client=pki["client1"]) as first,
        tls_client(mtls_server, ca=pki["ca1"], client=other) as second,
    ):
        session = first.quantized_inner_product(b, **p)
        assert [s["session_id"] for s in first.list_sessions()] == [session.session_id]
        assert second.list_sessions() == []
        from tensorops.protocol import wire

        forward = wire.build_request(
            wire.FORWARD_SESSION, {"session_id": session.session_id, "a": np.zeros((1, 16), np.uint8)}
        ).data
        with pytest.raises(tensorops.NotFoundError):
            second._invoke(wire.FORWARD_SESSION.path, forward)
        session.close()
