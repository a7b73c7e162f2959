"""Who may call the API: a signed request (HMAC-SHA256, shared key) or a staff session."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from typing import Any

from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware

from ..service import executor
from . import nonces

KEY_HEADER = "X-Executor-Key"
TIMESTAMP_HEADER = "X-Executor-Timestamp"
NONCE_HEADER = "X-Executor-Nonce"
SIGNATURE_HEADER = "X-Executor-Signature"
SIGNED_HEADERS = (KEY_HEADER, TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER)
NONCE_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,64}")
TIMESTAMP_PATTERN = re.compile(r"[0-9]{1,12}")


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
    if secret is None:
        raise Denied(401, f"unknown key id {key_id!r}")
    timestamp, nonce = values[TIMESTAMP_HEADER], values[NONCE_HEADER]
    if not TIMESTAMP_PATTERN.fullmatch(timestamp):
        raise Denied(401, f"{TIMESTAMP_HEADER} must be whole seconds since the Unix epoch")
    window = settings.API_SIGNATURE_WINDOW
    if abs(time.time() - int(timestamp)) > window:
        raise Denied(401, f"timestamp outside the signature window of {window:g} seconds")
    if not NONCE_PATTERN.fullmatch(nonce):
        raise Denied(401, f"{NONCE_HEADER} must be 16..64 characters of A-Z a-z 0-9 _ -")
    message = string_to_sign(
        key_id, request.method or "", request.get_full_path(), timestamp, nonce, request.body
    )
    expected = sign(secret, message)
    if not hmac.compare_digest(expected.encode(), values[SIGNATURE_HEADER].lower().encode()):
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
