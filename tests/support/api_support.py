"""Helpers of the HTTP API tests: the executor the API serves, logins, signed requests."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from django.test import Client, override_settings

from django_reliable_executor.service.reliable_executor import ReliableExecutor, executor
from tests.conftest import REDIS_SHARDS, REDIS_URL, delete_prefix, redis_client, require
from tests.support.admin_support import make_user

KEY_ID = "ops-1"

SECRET = "s3cret-" + "x" * 40

API = "/executor/api/tasks/"

HOOK = "contract.hook"


@contextlib.contextmanager
def api_executor(backend: str, **extra: Any) -> Iterator[ReliableExecutor]:
    """The module executor on ``backend`` with one API key (Redis: a key prefix of its own)."""
    require(backend)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    config: dict[str, Any] = {"API_KEYS": {KEY_ID: SECRET}, **extra}
    if backend == "redis":
        config.update(
            STORAGE="redis", REDIS_URL=REDIS_URL, KEY_PREFIX=prefix, REDIS_SHARDS=REDIS_SHARDS
        )
    else:
        config["DATABASE_ALIAS"] = backend
    try:
        with override_settings(RELIABLE_EXECUTOR=config):
            yield executor
    finally:
        if backend == "redis":
            client = redis_client()
            delete_prefix(client, prefix)
            client.close()


def login(client: Client, *permissions: str, staff: bool = True) -> Client:
    user = make_user(f"u-{uuid.uuid4().hex[:8]}", *permissions)
    if not staff:
        user.is_staff = False
        user.save()
    client.force_login(user)
    return client


def canonical(target: str) -> str:
    """The path and query string to sign, from either encoding: docs/api.md's client function."""
    path, _, query = target.partition("?")
    pairs = [
        "=".join(quote(unquote_to_bytes(p.replace("+", " ")), safe="") for p in part.split("=", 1))
        for part in query.split("&")
        if part
    ]
    return quote(unquote_to_bytes(path), safe="/") + ("?" + "&".join(pairs) if pairs else "")


def signed_headers(
    method: str,
    path: str,
    body: bytes = b"",
    *,
    key_id: str = KEY_ID,
    secret: str = SECRET,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The four headers, computed as docs/api.md tells a client to."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    nonce = nonce or uuid.uuid4().hex
    target = canonical(path)
    text = "\n".join([key_id, method, target, ts, nonce, hashlib.sha256(body).hexdigest()])
    signature = hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()
    return {
        "X-Executor-Key": key_id,
        "X-Executor-Timestamp": ts,
        "X-Executor-Nonce": nonce,
        "X-Executor-Signature": signature,
    }


def post_json(client: Client, path: str, data: Any = None, **headers: str) -> Any:
    body = data if isinstance(data, bytes) else json.dumps(data).encode() if data else b""
    return client.post(path, body, content_type="application/json", headers=headers)


def signed_post(client: Client, path: str, data: Any = None, **kwargs: Any) -> Any:
    body = json.dumps(data).encode() if data is not None else b""
    return post_json(client, path, body, **signed_headers("POST", path, body, **kwargs))


def signed_get(client: Client, path: str, **kwargs: Any) -> Any:
    return client.get(path, headers=signed_headers("GET", path, **kwargs))


def rejected(response: Any, reason: str) -> None:
    assert response.status_code == 401, response.content
    assert reason in response.json()["error"], response.json()
