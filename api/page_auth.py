"""Who a browser is on the web pages: a signed session cookie, and CSRF tokens for its forms.

Signing in checks a key exactly as the JSON API does (recallq.state.apikeys.KeyStore.authenticate)
and sets a cookie `KEY_ID.EXPIRES.NONCE.MAC`: the key's id, when the session ends, a random
session id, and an HMAC of the three keyed with the key's stored hash (and
RECALLQ_SESSION_SECRET when set). The key itself
is never in the cookie, a URL, a page or a log. Every request looks the key up by id again, so
a revoked key's sessions stop at once, and a role or project change applies at once; no
session state is kept anywhere, so every API process accepts every session and none needs
Redis. The price: signing out deletes the browser's cookie, but a copy of it stays valid
until it expires (SESSION_SECONDS) or its key is revoked.

Forms that change something (cancel, retry, sign out) carry a token bound to the cookie (an
HMAC of it); a POST without it, with another, or from another origin is refused. With
RECALLQ_AUTH=off there is no key: the cookie is a random browser id the CSRF token binds to.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from fastapi import Request, Response

from api.auth import DEFAULT_PRINCIPAL
from recallq.execution.runtime import Runtime
from recallq.state.apikeys import KeyStore, Principal, hash_key

COOKIE = "recallq_session"
SESSION_SECONDS = 12 * 3600
MAX_COOKIE_LENGTH = 200
_ANONYMOUS = "anon"


@dataclass(frozen=True)
class Browser:
    """A request's principal (None: not signed in) and the cookie its CSRF tokens bind to
    (None: none yet)."""

    principal: Principal | None
    cookie: str | None
    csrf_key: bytes

    @property
    def signed_in(self) -> bool:
        return self.principal is not None

    def csrf_token(self) -> str:
        if self.cookie is None:
            return ""
        return _mac(self.csrf_key, "csrf." + self.cookie)

    def csrf_valid(self, token: str) -> bool:
        return self.cookie is not None and hmac.compare_digest(self.csrf_token(), token)


def _mac(key: bytes, message: str) -> str:
    digest = hmac.new(key, message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _server_secret(runtime: Runtime) -> bytes:
    return (runtime.settings.session_secret or "").encode()


def _signing_key(runtime: Runtime, key_hash: str) -> bytes:
    return hmac.new(_server_secret(runtime), key_hash.encode(), hashlib.sha256).digest()


def _anonymous_key(runtime: Runtime) -> bytes:
    return hmac.new(_server_secret(runtime), b"anonymous browser", hashlib.sha256).digest()


def auth_off(runtime: Runtime) -> bool:
    return runtime.settings.auth == "off"


def browser(request: Request) -> Browser:
    """Who sent this request (reads the database when the cookie names a key)."""
    runtime: Runtime = request.app.state.runtime
    cookie = request.cookies.get(COOKIE)
    if cookie is not None and (len(cookie) > MAX_COOKIE_LENGTH or not cookie.isascii()):
        cookie = None
    if auth_off(runtime):
        anonymous = cookie if cookie is not None and cookie.startswith(_ANONYMOUS + ".") else None
        return Browser(DEFAULT_PRINCIPAL, anonymous, _anonymous_key(runtime))
    if cookie is None:
        return Browser(None, None, b"")
    keys: KeyStore = request.app.state.keys
    session = _verified(runtime, keys, cookie)
    if session is None:
        return Browser(None, None, b"")
    principal, signing_key = session
    return Browser(principal, cookie, signing_key)


def _verified(runtime: Runtime, keys: KeyStore, cookie: str) -> tuple[Principal, bytes] | None:
    parts = cookie.split(".")
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    key_id, expires, nonce, mac = parts
    if int(expires) < time.time():
        return None
    found = keys.active(key_id)
    if found is None:  # unknown or revoked
        return None
    principal, key_hash = found
    signing_key = _signing_key(runtime, key_hash)
    if not hmac.compare_digest(_mac(signing_key, f"{key_id}.{expires}.{nonce}"), mac):
        return None
    return principal, signing_key


def sign_in(request: Request, key: str) -> str | None:
    """A session cookie's value for this key, or None for an unknown or revoked key."""
    runtime: Runtime = request.app.state.runtime
    keys: KeyStore = request.app.state.keys
    principal = keys.authenticate(key)
    if principal is None or principal.key_id is None:
        return None
    session = f"{principal.key_id}.{int(time.time()) + SESSION_SECONDS}.{secrets.token_urlsafe(12)}"
    return f"{session}.{_mac(_signing_key(runtime, hash_key(key)), session)}"


def new_anonymous_cookie() -> str:
    return f"{_ANONYMOUS}.{secrets.token_urlsafe(24)}"


def set_cookie(request: Request, response: Response, value: str) -> None:
    response.set_cookie(
        COOKIE,
        value,
        max_age=SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")


def same_origin(request: Request) -> bool:
    """False when the request says it comes from another origin (Origin, else Sec-Fetch-Site);
    a request that says nothing (an old browser, a script) is judged by its CSRF token only.
    Pages are served with `Referrer-Policy: no-referrer`, under which browsers send a form's
    Origin as "null": then Sec-Fetch-Site (set by the browser alone) tells."""
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        return origin == f"{request.url.scheme}://{request.url.netloc}"
    return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")
