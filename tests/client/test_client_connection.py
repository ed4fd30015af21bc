"""What a client says when it cannot connect for a reason the user can fix (TLS on one side
only, a certificate it does not trust), against real servers with certificates made by
trustme, and what it says when the data's layout needs a `format` it was not given."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import trustme

import tensorops
import tensorops.aio
from rpc_server import ServerProcess

# A new connection (and TLS handshake) for every client.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    ca, stranger = trustme.CA(), trustme.CA()
    leaf = ca.issue_cert("localhost", "127.0.0.1")
    client_leaf = ca.issue_cert("client.example")
    (directory / "cert.pem").write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(directory / "key.pem"))
    return {
        "dir": directory,
        "ca": ca.cert_pem.bytes(),
        "stranger": stranger.cert_pem.bytes(),
        "client": dict(
            certificate_chain=b"".join(blob.bytes() for blob in client_leaf.cert_chain_pems),
            private_key=client_leaf.private_key_pem.bytes(),
        ),
    }


@pytest.fixture(scope="module")
def servers(tmp_path_factory, pki):
    directory = pki["dir"]
    tls = ServerProcess(
        tmp_path_factory.mktemp("tls") / "server.log",
        "--tls-cert",
        str(directory / "cert.pem"),
        "--tls-key",
        str(directory / "key.pem"),
    ).start()
    plain = ServerProcess(tmp_path_factory.mktemp("plain") / "server.log").start()
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(pki["ca"])
    mutual = ServerProcess(
        tmp_path_factory.mktemp("mutual") / "server.log",
        "--tls-cert",
        str(directory / "cert.pem"),
        "--tls-key",
        str(directory / "key.pem"),
        "--tls-client-ca",
        str(ca_file),
    ).start()
    yield {"tls": tls, "plain": plain, "mutual": mutual}
    for proc in (tls, plain, mutual):
        proc.kill()


def info_error(kind: str, target: str, **kwargs) -> tensorops.TensorOpsError | None:
    """The error of one info() call through a new client of `kind` (None if it worked)."""
    kwargs.update(timeout=10, max_attempts=1, options=OWN_CONNECTION)
    try:
        if kind == "sync":
            with tensorops.Client(target, **kwargs) as c:
                c.info()
        else:

            async def main():
                async with tensorops.aio.Client(target, **kwargs) as c:
                    await c.info()

            asyncio.run(main())
    except tensorops.TensorOpsError as exc:
        return exc
    return None


KINDS = pytest.mark.parametrize("kind", ["sync", "aio"])


# One address (pick_first) and a list of addresses (round_robin): gRPC words each failure
# differently.
TARGET_FORMS = pytest.mark.parametrize("form", ["{}", "ipv4:{0},{0}"], ids=["pick_first", "round_robin"])


@KINDS
@TARGET_FORMS
def test_plaintext_client_to_tls_server(servers, kind, form):
    err = info_error(kind, form.format(servers["tls"].target))
    assert isinstance(err, tensorops.UnavailableError)
    assert err.details.startswith("the server closed the connection before answering: it probably requires TLS")
    assert "[gRPC: " in err.details and "Socket closed" in err.details


@KINDS
@TARGET_FORMS
def test_tls_client_to_plaintext_server(servers, pki, kind, form):
    err = info_error(kind, form.format(servers["plain"].target), root_certificates=pki["ca"])
    assert isinstance(err, tensorops.UnavailableError)
    assert "it probably is a plaintext server (no --tls-cert)" in err.details
    assert "WRONG_VERSION_NUMBER" in err.details


@KINDS
def test_untrusted_certificate(servers, pki, kind):
    err = info_error(kind, servers["tls"].target, root_certificates=pki["stranger"])
    assert "the server's certificate does not chain to the trusted CAs" in err.details
    assert "CERTIFICATE_VERIFY_FAILED" in err.details


@KINDS
def test_certificate_for_another_name(servers, pki, kind):
    err = info_error(kind, servers["tls"].target, root_certificates=pki["ca"], server_name_override="example.com")
    assert "does not name the host of the target" in err.details


@KINDS
def test_tls_client_without_the_client_certificate_a_server_requires(servers, pki, kind):
    err = info_error(kind, servers["mutual"].target, root_certificates=pki["ca"])
    assert isinstance(err, tensorops.UnavailableError)
    assert "it probably requires a client certificate (certificate_chain= and private_key=)" in err.details
    assert info_error(kind, servers["mutual"].target, root_certificates=pki["ca"], **pki["client"]) is None


@KINDS
def test_matching_sides_connect_and_other_failures_keep_grpcs_words(servers, pki, kind):
    assert info_error(kind, servers["plain"].target) is None
    assert info_error(kind, servers["tls"].target, root_certificates=pki["ca"]) is None
    refused = info_error(kind, "127.0.0.1:1")  # nothing listens there: no cause guessed
    assert isinstance(refused, tensorops.UnavailableError)
    assert refused.details.startswith("failed to connect to all addresses") and "TLS" not in refused.details


# ---- a format the data needs

NHWC = np.random.default_rng(3).standard_normal((2, 4, 5, 3)).astype(np.float32)  # 3 channels, last
SCALE, SHIFT = np.ones(3, np.float32), np.zeros(3, np.float32)
FORMAT_CASES = {
    "layer_norm_channels": (lambda c, **kw: c.layer_norm_channels(NHWC, SCALE, SHIFT, **kw), "scale"),
    "channel_norm": (lambda c, **kw: c.channel_norm(NHWC, SCALE, SHIFT, **kw), "scale"),
    "normalize_l2": (lambda c, **kw: c.normalize_l2(NHWC, SCALE, **kw), "scale"),
    "tiled_scale_2d": (
        lambda c, **kw: c.tiled_scale_2d(NHWC, np.ones((5, 3), np.float32), np.ones((4, 3), np.float32), **kw),
        "ver",
    ),
}


@pytest.mark.parametrize("case", FORMAT_CASES)
@pytest.mark.parametrize("kind", ["remote", "local"])
def test_nhwc_data_without_format_names_the_format(servers, case, kind):
    call, field = FORMAT_CASES[case]
    client = tensorops.Client(servers["plain"].target, timeout=30) if kind == "remote" else tensorops.LocalClient()
    with client:
        with pytest.raises(tensorops.InvalidArgumentError) as err:
            call(client)
        assert err.value.field == field
        assert "x is read as format='nchw' (the default); if x is NHWC, pass format='nhwc'" in str(err.value)
        assert call(client, format="nhwc").shape == NHWC.shape
        with pytest.raises(tensorops.InvalidArgumentError) as err:  # a shape neither format explains
            client.layer_norm_channels(NHWC, np.ones(7, np.float32), np.zeros(7, np.float32))
        assert "format" not in str(err.value)
