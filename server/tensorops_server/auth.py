"""Who is calling: bearer tokens and client certificates become an identity.

- With tokens configured (TENSOROPS_AUTH_TOKENS, comma-separated, and/or --auth-token-file,
  one per line), every call but the health checks must carry `authorization: Bearer
  <token>` with one of them; otherwise it ends with UNAUTHENTICATED before its request
  is even read. The file is re-read when it changes (checked at most once a second), so
  tokens rotate without a restart: during a rotation both the old and the new token are
  listed. Tokens are compared in constant time.
- The identity of a call owns the sessions it creates. It is the token (as a digest,
  never the token itself), else the client certificate's subject (mutual TLS), else one
  shared anonymous identity.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time

from . import errors
from .logs import LOGGER, fields

log = logging.getLogger(LOGGER)

ANONYMOUS = "anonymous"
_PREFIX = "bearer "


def _digest(token: bytes) -> str:
    return "token:" + hashlib.sha256(token).hexdigest()[:16]


class Authenticator:
    def __init__(self, tokens: str = "", token_file: str = "", *, certificates: bool = False, clock=time.monotonic):
        self._env_tokens = [t.strip().encode() for t in tokens.split(",") if t.strip()]
        self._file = token_file
        self._file_tokens: list[bytes] = []
        self._file_stamp = None
        self._checked = float("-inf")
        self._clock = clock
        self._certificates = certificates  # mutual TLS: the certificate names the caller
        if token_file:
            self._reload(force=True)

    @property
    def enabled(self) -> bool:
        return bool(self._env_tokens or self._file)

    def identify(self, context) -> str:
        """The caller's identity; UNAUTHENTICATED if tokens are required and not given."""
        if not self.enabled:
            return (self._certificates and _certificate_subject(context)) or ANONYMOUS
        token = None
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                text = value if isinstance(value, str) else value.decode("latin-1")
                if text[: len(_PREFIX)].lower() == _PREFIX:
                    token = text[len(_PREFIX) :].strip().encode()
                break
        if token is None:
            raise errors.unauthenticated("the call needs an `authorization: Bearer <token>` header")
        if not self._valid(token):
            raise errors.unauthenticated("the token is not valid")
        return _digest(token)

    def _valid(self, token: bytes) -> bool:
        if self._file:
            self._reload()
        ok = False
        for known in (*self._env_tokens, *self._file_tokens):  # no early exit: constant time
            ok |= hmac.compare_digest(known, token)
        return ok

    def _reload(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._checked < 1.0:
            return
        self._checked = now
        try:
            st = os.stat(self._file)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._file_stamp:
                return
            with open(self._file, "rb") as f:
                tokens = [line.strip() for line in f.read().splitlines()]
        except OSError as exc:
            if force:
                raise OSError(f"cannot read the auth token file {self._file}: {exc}") from None
            log.warning(
                "auth token file unreadable; keeping the tokens read before",
                extra=fields(file=self._file, error=str(exc)),
            )
            return
        self._file_tokens = [t for t in tokens if t and not t.startswith(b"#")]
        self._file_stamp = stamp
        log.info("auth tokens loaded", extra=fields(file=self._file, tokens=len(self._file_tokens)))


def _certificate_subject(context) -> str | None:
    """The verified client certificate's subject, under mutual TLS."""
    try:
        auth = context.auth_context()
    except Exception:
        return None
    subject = auth.get("x509_subject") or auth.get("x509_common_name")
    return "cert:" + subject[0].decode("utf-8", "replace") if subject else None
