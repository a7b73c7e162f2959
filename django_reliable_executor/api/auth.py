"""Who may call the API: a signed request (HMAC-SHA256, shared key) or a staff session."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware

from ..service.reliable_executor import executor
from . import nonces

KEY_HEADER = "X-Executor-Key"
TIMESTAMP_HEADER = "X-Executor-Timestamp"
NONCE_HEADER = "X-Executor-Nonce"
SIGNATURE_HEADER = "X-Executor-Signature"
SIGNED_HEADERS = (KEY_HEADER, TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER)
NONCE_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,64}")
TIMESTAMP_PATTERN = re.compile(r"[0-9]{1,12}")
# Signs the requests naming an unknown key id, so they take the same path as a bad signature.
_UNKNOWN_KEY_SECRET = secrets.token_hex(32)

logger = logging.getLogger("django_reliable_executor")


class Denied(Exception):
    """The request may not go on: ``status`` (401 or 403) and a reason for the caller."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def is_signed(request: HttpRequest) -> bool:
    """True when the request carries any of the signature headers."""
    return any(header in request.headers for header in SIGNED_HEADERS)


def string_to_sign(
    key_id: str, method: str, path: str, timestamp: str, nonce: str, body: bytes
) -> bytes:
    """The signed text: key id, method, path with query, timestamp, nonce, SHA-256 of the body."""
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join([key_id, method.upper(), path, timestamp, nonce, digest]).encode()


def canonical_target(path: str, query_string: str) -> str:
    """The signed form of a request's path and query string, whichever encoding was sent.

    ``path`` is the percent-decoded path (``request.path``); every byte of its UTF-8 outside
    RFC 3986's unreserved characters (``A-Z a-z 0-9 - _ . ~``) and ``/`` is percent-encoded
    with upper-case hex. The query string keeps its order; in each ``&``-separated part (empty
    parts dropped) the name and the value, split at the first ``=``, are percent-decoded
    (``+`` is a space) and encoded the same way, ``/`` included."""
    target = quote(path, safe="/")
    parts = []
    for part in query_string.split("&"):
        if part:
            pieces = part.split("=", 1)
            parts.append("=".join(quote(_decoded(piece), safe="") for piece in pieces))
    return target + ("?" + "&".join(parts) if parts else "")


def _decoded(piece: str) -> bytes:
    # A WSGI query string holds the request's bytes as latin-1 characters.
    try:
        raw = piece.encode("iso-8859-1")
    except UnicodeEncodeError:
        raw = piece.encode()
    return unquote_to_bytes(raw.replace(b"+", b" "))


def sign(secret: str, message: bytes) -> str:
    """Lower-case hex HMAC-SHA256 of ``message`` under ``secret``."""
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def check_signature(request: HttpRequest) -> str:
    """Verify a signed request and spend its nonce; returns the key id or raises Denied(401)."""
    values = {header: request.headers.get(header, "") for header in SIGNED_HEADERS}
    missing = [header for header, value in values.items() if not value]
    if missing:
        raise Denied(401, f"signed request without the {missing[0]} header")
    settings = executor.settings
    key_id = values[KEY_HEADER]
    secret = settings.API_KEYS.get(key_id)
    timestamp, nonce = values[TIMESTAMP_HEADER], values[NONCE_HEADER]
    if not TIMESTAMP_PATTERN.fullmatch(timestamp):
        raise Denied(401, f"{TIMESTAMP_HEADER} must be whole seconds since the Unix epoch")
    window = settings.API_SIGNATURE_WINDOW
    if abs(time.time() - int(timestamp)) > window:
        raise Denied(401, f"timestamp outside the signature window of {window:g} seconds")
    if not NONCE_PATTERN.fullmatch(nonce):
        raise Denied(401, f"{NONCE_HEADER} must be 16..64 characters of A-Z a-z 0-9 _ -")
    target = canonical_target(request.path, request.META.get("QUERY_STRING", ""))
    message = string_to_sign(key_id, request.method or "", target, timestamp, nonce, request.body)
    # An unknown key id is answered like a bad signature, after the same work, so the answer
    # does not tell an unauthenticated caller which key ids exist; the log tells them apart.
    expected = sign(_UNKNOWN_KEY_SECRET if secret is None else secret, message)
    valid = hmac.compare_digest(expected.encode(), values[SIGNATURE_HEADER].lower().encode())
    if secret is None or not valid:
        logger.warning(
            "API: signed request refused: %s (%s %s)",
            f"unknown key id {key_id!r}"
            if secret is None
            else f"bad signature for key id {key_id!r}",
            request.method,
            target,
        )
        raise Denied(401, "bad signature")
    # A nonce is spent only by a valid signature, and kept until its timestamp can no longer
    # pass the window check (it may lie up to one window in the future).
    if not nonces.claim(key_id, nonce, 2 * window + 1):
        raise Denied(401, "nonce already used")
    return key_id


class _CsrfCheck(CsrfViewMiddleware):
    def _reject(self, request: HttpRequest, reason: str) -> Any:
        return reason


def check_session(request: HttpRequest, permission: str) -> None:
    """Require a logged-in staff user holding ``permission`` and, on POST, a valid CSRF token."""
    user = getattr(request, "user", None)  # None without AuthenticationMiddleware
    if user is None or not user.is_authenticated:
        raise Denied(401, "authentication required: a staff session or a signed request")
    if not (user.is_active and user.is_staff and user.has_perm(permission)):
        raise Denied(403, f"permission {permission} required")
    if request.method not in ("GET", "HEAD", "OPTIONS", "TRACE"):
        reason = _CsrfCheck(lambda r: None).process_view(request, None, (), {})  # type: ignore[arg-type,return-value]
        if reason:
            raise Denied(403, f"CSRF check failed: {reason}")


def authorize(request: HttpRequest, permission: str) -> None:
    """Signed requests by their signature, others by their session; raises Denied."""
    if is_signed(request):
        check_signature(request)
    else:
        check_session(request, permission)


def may(request: HttpRequest, permission: str) -> bool:
    """Whether the caller ``authorize`` let in also holds ``permission``: a signed request
    holds every one (a key grants every endpoint), a session user only those it was given."""
    if is_signed(request):
        return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.has_perm(permission))
