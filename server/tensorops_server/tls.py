"""TLS and mutual TLS for the gRPC port, with certificate rotation without a restart.

gRPC asks `CertificateFiles.fetch` for the certificate configuration before every new
TLS handshake. It looks at the files' size and modification time (one stat each) and
hands gRPC a new configuration only when they changed, or when `request_reload()` was
called (the server does that on SIGHUP). A new set of files is checked first: a key that
does not match its certificate, or a file that does not parse (a rotation caught half
way), is logged as a warning and the previous configuration stays in force. Connections
already open keep the configuration of their handshake."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import ssl
import tempfile
import threading
from dataclasses import dataclass

import grpc

from .config import Config
from .logs import LOGGER, fields

log = logging.getLogger(LOGGER)


class TLSConfigError(OSError):
    """The TLS flags are inconsistent or their files cannot be used (the server does not start)."""


@dataclass(frozen=True)
class _Material:
    """The bytes of one consistent set of files, and the stamps they were read under."""

    cert: bytes
    key: bytes
    client_ca: bytes | None
    stamps: tuple

    @property
    def digest(self) -> str:
        h = hashlib.sha256()
        for part in (self.cert, self.key, self.client_ca or b""):
            h.update(hashlib.sha256(part).digest())
        return h.hexdigest()[:16]

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(self.key, self.cert)], root_certificates=self.client_ca)


class CertificateFiles:
    """The PEM files behind the server's TLS credentials (see the module docstring)."""

    def __init__(self, cert: str, key: str, client_ca: str = ""):
        if bool(cert) != bool(key):
            missing = "--tls-key (TENSOROPS_TLS_KEY)" if cert else "--tls-cert (TENSOROPS_TLS_CERT)"
            raise TLSConfigError(f"TLS needs a certificate and its private key together: {missing} is not set")
        if client_ca and not cert:
            raise TLSConfigError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        self.paths = {"cert": cert, "key": key}
        if client_ca:
            self.paths["client_ca"] = client_ca
        self._lock = threading.Lock()
        self._reloads_requested = self._reloads_done = 0  # counters: no request lost to a race
        try:
            self._current = self._read()
        except (OSError, ValueError) as exc:
            raise TLSConfigError(f"cannot use the TLS files: {exc}") from None
        self._rejected: tuple | None = None  # stamps of files found unusable, not to warn again

    @property
    def mutual(self) -> bool:
        return "client_ca" in self.paths

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._current.configuration(), self.fetch, require_client_authentication=self.mutual
        )

    def request_reload(self) -> None:
        """Re-read the files at the next handshake even if they look unchanged (SIGHUP).
        Only counts the request: safe in a signal handler."""
        self._reloads_requested += 1

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's certificate configuration fetcher: a new configuration, or None to keep
        the current one. Never raises."""
        try:
            with self._lock:
                return self._fetch()
        except Exception:
            log.exception("tls reload failed; keeping the current certificate")
            return None

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        requested = self._reloads_requested
        forced, self._reloads_done = requested != self._reloads_done, requested
        try:
            stamps = self._stamps()
        except OSError as exc:  # a file missing or unreadable: keyed by the error, not to warn again
            return self._reject(("unreadable", str(exc)), exc, forced)
        if not forced and stamps in (self._current.stamps, self._rejected):
            return None
        try:
            material = self._read()
        except (OSError, ValueError) as exc:
            return self._reject(stamps, exc, forced)
        previous, self._current, self._rejected = self._current, material, None
        log.info(
            "tls reloaded",
            extra=fields(
                **self.paths, sha256=material.digest, changed=material.digest != previous.digest, forced=forced
            ),
        )
        return material.configuration()

    def _reject(self, stamps: tuple, exc: Exception, forced: bool) -> None:
        if forced or stamps != self._rejected:
            log.warning(
                "tls files not usable; keeping the current certificate", extra=fields(**self.paths, error=str(exc))
            )
        self._rejected = stamps
        return None

    def _stamps(self) -> tuple:
        out = []
        for path in self.paths.values():
            st = os.stat(path)
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _read(self) -> _Material:
        """Read and check the files; a file replaced while it was read is an error (the
        next handshake tries again)."""
        before = self._stamps()
        data = {}
        for name, path in self.paths.items():
            with open(path, "rb") as f:
                data[name] = f.read()
        if self._stamps() != before:
            raise ValueError("the files changed while they were read")
        _check(data["cert"], data["key"], data.get("client_ca"))
        return _Material(data["cert"], data["key"], data.get("client_ca"), before)


def _check(cert: bytes, key: bytes, client_ca: bytes | None) -> None:
    """ValueError unless the certificate chain and key parse and belong together, and the
    client CA bundle (if any) holds at least one certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with _pem_path(cert) as cert_path, _pem_path(key) as key_path:
        try:
            context.load_cert_chain(cert_path, key_path, password=_no_password)
        except (ssl.SSLError, TypeError) as exc:
            raise ValueError(f"certificate and private key do not parse or do not match ({exc})") from None
    if client_ca is not None:
        try:
            context.load_verify_locations(cadata=client_ca.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError) as exc:
            raise ValueError(f"the client CA bundle does not parse ({exc})") from None


def _no_password() -> bytes:
    raise TypeError("the private key is encrypted (gRPC needs an unencrypted PEM key)")


@contextlib.contextmanager
def _pem_path(data: bytes):
    """A path the ssl module can load `data` from, without writing a key to disk where an
    in-memory file exists (Linux memfd)."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("tensorops-tls", getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="tensorops-tls-") as directory:
        path = os.path.join(directory, "pem")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(data)
        yield path


def from_config(config: Config) -> CertificateFiles | None:
    """The server's certificate files, or None without --tls-cert/--tls-key (plain TCP).
    TLSConfigError (an OSError) when the flags or the files are not usable."""
    if not (config.tls_cert or config.tls_key or config.tls_client_ca):
        return None
    files = CertificateFiles(config.tls_cert, config.tls_key, config.tls_client_ca)
    log.info("tls", extra=fields(**files.paths, mutual=files.mutual, sha256=files._current.digest))
    return files
