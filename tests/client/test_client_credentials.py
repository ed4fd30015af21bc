"""Channel credentials and the bearer token rule of the clients, without a server (a
channel connects only at its first call)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

import tensorops
import tensorops.aio
from tensorops._client import channel_credentials, is_loopback_target

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
AUTH = ("authorization", "Bearer s3cret")

LOOPBACK = [
    "127.0.0.1:50051",
    "127.8.9.10:1",
    "localhost:50051",
    "LOCALHOST",
    "localhost.:1",
    "[::1]:50051",
    "::1",
    "ipv4:127.0.0.1:1,127.0.0.2:2",
    "ipv6:[::1]:1",
    "dns:localhost:1",
    "dns:///localhost:1",
    "dns://8.8.8.8/127.0.0.1:1",
    "unix:/run/tensorops.sock",
    "unix:///run/tensorops.sock",
    "unix-abstract:tensorops",
]
REMOTE = [
    "10.0.0.1:50051",
    "example.com:50051",
    "localhost.example.com:1",
    "[2001:db8::1]:1",
    "0.0.0.0:1",
    "ipv4:127.0.0.1:1,10.0.0.1:2",
    "dns:///example.com:443",
    "128.0.0.1:1",
    "",
]


@pytest.mark.parametrize("target", LOOPBACK)
def test_loopback_targets(target):
    assert is_loopback_target(target)


@pytest.mark.parametrize("target", REMOTE)
def test_remote_targets(target):
    assert not is_loopback_target(target)


def make(client_class, target, **kwargs):
    """Construct (and close) a client of either kind; its metadata."""
    if client_class is tensorops.Client:
        with client_class(target, **kwargs) as c:
            return c.metadata

    async def build():
        c = client_class(target, **kwargs)
        await c.close()
        return c.metadata

    return asyncio.run(build())


CLIENTS = pytest.mark.parametrize("client_class", [tensorops.Client, tensorops.aio.Client], ids=["sync", "aio"])


@CLIENTS
@pytest.mark.parametrize("target", ["localhost:50051", "10.0.0.1:50051"])
def test_token_refused_on_plaintext(client_class, target):
    with pytest.raises(ValueError, match="^token: refusing"):
        make(client_class, target, token="s3cret")


@CLIENTS
@pytest.mark.parametrize("target", REMOTE[:3])
def test_allow_insecure_token_only_for_loopback(client_class, target):
    with pytest.raises(ValueError, match="^token: allow_insecure_token"):
        make(client_class, target, token="s3cret", allow_insecure_token=True)


@CLIENTS
@pytest.mark.parametrize("target", ["127.0.0.1:50051", "localhost:50051", "[::1]:50051", "unix:/tmp/t.sock"])
def test_token_on_plaintext_loopback_when_allowed(client_class, target):
    metadata = make(client_class, target, token="s3cret", allow_insecure_token=True, metadata=[("x-a", "1")])
    assert metadata == (("x-a", "1"), AUTH)


@CLIENTS
def test_token_over_tls(client_class):
    assert make(client_class, "example.com:443", token="s3cret", root_certificates=PEM) == (AUTH,)
    creds = grpc.ssl_channel_credentials()
    assert make(client_class, "example.com:443", token="s3cret", credentials=creds) == (AUTH,)


def test_token_reaches_every_call():
    with tensorops.Client("127.0.0.1:1", token="s3cret", allow_insecure_token=True) as c:
        assert c._call_options(None, [("x-b", "2")])["metadata"] == (AUTH, ("x-b", "2"))


@pytest.mark.parametrize("token", ["", b"bytes"])
def test_token_must_be_a_non_empty_str(token):
    with pytest.raises(ValueError, match="^token"):
        tensorops.Client("127.0.0.1:1", token=token, allow_insecure_token=True)


def test_no_pem_no_credentials():
    assert channel_credentials(None) is None
    creds = grpc.local_channel_credentials()
    assert channel_credentials(creds) is creds


def test_pem_arguments_make_ssl_credentials(tmp_path):
    path = tmp_path / "ca.pem"
    path.write_bytes(PEM)
    for root in (PEM, PEM.decode(), path, str(path)):
        assert isinstance(channel_credentials(None, root), grpc.ChannelCredentials)
    assert isinstance(channel_credentials(None, certificate_chain=PEM, private_key=path), grpc.ChannelCredentials)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(certificate_chain=PEM), "^private_key"),
        (dict(private_key=PEM), "^certificate_chain"),
        (dict(root_certificates="/nonexistent/ca.pem"), "^root_certificates: cannot read '/nonexistent/ca.pem'"),
        (dict(root_certificates=PEM, credentials=grpc.ssl_channel_credentials()), "^credentials"),
    ],
)
def test_bad_pem_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        tensorops.Client("localhost:1", **kwargs)


def test_pem_argument_of_a_wrong_type():
    with pytest.raises(TypeError, match="^private_key"):
        tensorops.Client("localhost:1", certificate_chain=PEM, private_key=42)


def test_server_name_override_sets_the_channel_option():
    with tensorops.Client("127.0.0.1:1", root_certificates=PEM, server_name_override="svc.test") as c:
        assert ("grpc.ssl_target_name_override", "svc.test") in c._options
    with tensorops.Client("127.0.0.1:1") as c:
        assert all(key != "grpc.ssl_target_name_override" for key, _ in c._options)
