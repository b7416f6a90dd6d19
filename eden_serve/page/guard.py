"""Who may use the page: an ASGI middleware in front of every request, HTTP and WebSocket alike.

- **The token.** Every request carries it, in the cookie that the first visit sets from the URL's
  ``?token=`` (HttpOnly, SameSite=Strict, named after the port so that two pages on one host do not
  share one) or in ``Authorization: Bearer``; it is compared in constant time. The URL's token is
  taken on ``GET /`` only, which answers with the cookie and a redirect to a URL without it.
- **The address.** ``Host`` must name the address the page is bound to (``localhost`` too, for a
  loopback one), so a page of another site whose name an attacker re-points at 127.0.0.1 (DNS
  rebinding) is refused; an ``Origin``, where the browser sends one (every POST and WebSocket),
  must be the page's own.
- **What a response may do.** A content security policy keeps the page to its own scripts, styles,
  media and connection, no frame may embed it, and no Referer leaves it.

A refusal is ``403`` with the package's JSON error document; a WebSocket is closed before it opens.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from http.cookies import SimpleCookie
from urllib.parse import parse_qs

from ..errors import EdenError


class Forbidden(EdenError):
    status = 403
    kind = "forbidden"


SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
                                 b"media-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
                                 b"frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


def allowed_hosts(host: str, port: int) -> set[str]:
    """The ``Host`` values that name the page: its address and port, and ``localhost`` for loopback."""
    address = ipaddress.ip_address(host)
    literal = f"[{host}]" if address.version == 6 else host
    names = {literal}
    if address.is_loopback:
        names |= {"localhost", "127.0.0.1", "[::1]"}
    return {f"{name}:{port}" for name in names}


class Guard:
    """Wraps the ASGI application ``app``: only requests to one of ``hosts``, from no origin or the
    page's own, holding ``token``, reach it."""

    def __init__(self, app, token: str, hosts: set[str], port: int):
        self.app, self.token, self.hosts = app, token.encode(), hosts
        self.origins = {f"http://{host}".encode() for host in hosts}
        self.cookie = f"eden_page_{port}"

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.lower(), value)
        try:
            self._check_address(headers)
            query_token = self._query_token(scope)
            if query_token is not None and scope["type"] == "http" and scope["path"] == "/" and scope["method"] == "GET":
                return await self._enter(query_token, send)
            self._check_token(headers)
        except Forbidden as exc:
            return await self._refuse(scope, send, exc)
        await self.app(scope, receive, self._with_headers(send) if scope["type"] == "http" else send)

    def _check_address(self, headers: dict) -> None:
        host = headers.get(b"host", b"").decode("latin-1")
        if host not in self.hosts:
            raise Forbidden(f"this page answers to {' or '.join(sorted(self.hosts))}, not to host {host[:80]!r}")
        origin = headers.get(b"origin")
        if origin is not None and origin not in self.origins:
            raise Forbidden(f"requests from origin {origin.decode('latin-1')[:80]!r} are refused: only the page itself may call it")

    def _query_token(self, scope) -> str | None:
        values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
        return values[0] if values else None

    def _matches(self, given: str | bytes | None) -> bool:
        if given is None:
            return False
        given = given.encode("latin-1", "replace") if isinstance(given, str) else given
        return hmac.compare_digest(given, self.token)

    def _check_token(self, headers: dict) -> None:
        authorization = headers.get(b"authorization", b"")
        if authorization[:7].lower() == b"bearer " and self._matches(authorization[7:].strip()):
            return
        cookies = SimpleCookie()
        try:
            cookies.load(headers.get(b"cookie", b"").decode("latin-1"))
        except Exception:  # a malformed cookie header is no token
            cookies = SimpleCookie()
        morsel = cookies.get(self.cookie)
        if not self._matches(morsel.value if morsel is not None else None):
            raise Forbidden("a valid token is needed: open the address the command printed (http://…/?token=…)")

    async def _enter(self, token: str, send) -> None:
        """``GET /?token=``: the cookie, and the page again without the token in its address."""
        if not self._matches(token):
            return await self._refuse({"type": "http"}, send, Forbidden("wrong token: open the address the command printed"))
        cookie = f"{self.cookie}={token}; Path=/; HttpOnly; SameSite=Strict".encode()
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", b"/"), (b"set-cookie", cookie), (b"content-length", b"0"), *SECURITY_HEADERS]})
        await send({"type": "http.response.body", "body": b""})

    async def _refuse(self, scope, send, exc: Forbidden) -> None:
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps(exc.to_json()).encode()
        await send({"type": "http.response.start", "status": exc.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                *SECURITY_HEADERS]})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    def _with_headers(send):
        async def sending(message):
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(name, value) for name, value in SECURITY_HEADERS if name not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        return sending

