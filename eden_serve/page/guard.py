"""Who may use the page: an ASGI middleware in front of every request, HTTP and WebSocket alike
(docs/page.md, "Safe to leave open").

- **The token, in no cookie.** A browser sends a cookie to every port of its host, so a cookie
  would reach any other server on this machine (and be used by any page it serves). The page's
  script takes the token from the URL's ``?token=`` into the tab's own storage (kept by origin:
  scheme, host and port) and sends it as ``Authorization: Bearer`` (a WebSocket, which can set no
  header, offers it as its second subprotocol after ``eden-page``). It is compared in constant
  time. ``/`` and ``/static/`` hold no secret and need none; ``/?token=`` with a wrong one is refused.
- **Media by signed URLs.** What a media element or a download loads, which carries no header, is
  asked by a URL that the page signed for that path alone (:class:`Signer`: an HMAC under a key of
  this process's own, valid for :data:`SIGNED_FOR` seconds).
- **This page only.** ``Host`` must name the address the page is bound to (``localhost`` too, for a
  loopback one): a page of another site that an attacker re-points at 127.0.0.1 (DNS rebinding) is
  refused. An ``Origin``, where the browser sends one, must be the page's own, and a request whose
  ``Sec-Fetch-Site`` (sent by browsers) is neither ``same-origin`` nor ``none`` is refused: another
  port of this host is the same *site*, never the same *origin*.
- **What a response may do.** A content security policy keeps the page to its own scripts, styles,
  media and connection, no frame may embed it, and no Referer leaves it.

A refusal is ``403`` with the package's JSON error document; a WebSocket is closed before it opens.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from urllib.parse import parse_qs

from ..errors import EdenError

SUBPROTOCOL = "eden-page"  # a WebSocket's first subprotocol; its second is the token
SIGNED_FOR = 300  # seconds a signed media URL is good for
# Sec-Fetch-Site values a request may carry: the page itself, or the user (an address typed or opened).
FETCH_SITES = {b"same-origin", b"none"}


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


class Signer:
    """URLs of the page's media, each good for one path (and query) for :data:`SIGNED_FOR` seconds."""

    def __init__(self, key: bytes | None = None, lifetime: float = SIGNED_FOR):
        self.key, self.lifetime = key or secrets.token_bytes(32), lifetime

    def _tag(self, target: str, expires: int) -> str:
        return hmac.new(self.key, f"{target}\n{expires}".encode(), hashlib.sha256).hexdigest()

    def sign(self, target: str, now: float | None = None) -> str:
        """``target`` (a path, with its query) with ``exp`` and ``sig`` after it."""
        expires = int((time.time() if now is None else now) + self.lifetime)
        return f"{target}{'&' if '?' in target else '?'}exp={expires}&sig={self._tag(target, expires)}"

    def check(self, path: str, query: str, now: float | None = None) -> bool:
        """Whether ``path`` with its raw ``query`` is a URL this signer made that has not expired."""
        parts = query.split("&") if query else []
        if len(parts) < 2 or not parts[-2].startswith("exp=") or not parts[-1].startswith("sig="):
            return False
        expires = parts[-2][4:]
        if not (expires.isascii() and expires.isdigit() and len(expires) <= 12):
            return False
        left = int(expires) - (time.time() if now is None else now)
        target = f"{path}?{'&'.join(parts[:-2])}" if parts[:-2] else path
        return 0 < left <= self.lifetime and hmac.compare_digest(parts[-1][4:], self._tag(target, int(expires)))


class Guard:
    """Wraps the ASGI application ``app``: only requests to one of ``hosts``, from the page itself
    (or no page), holding ``token`` or a URL ``signer`` signed, reach it; ``/`` and ``/static/``
    need no token."""

    def __init__(self, app, token: str, hosts: set[str], signer: Signer):
        self.app, self.token, self.hosts, self.signer = app, token.encode(), hosts, signer
        self.origins = {f"http://{host}".encode() for host in hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.lower(), value)
        try:
            self._check_address(headers)
            if not self._public(scope) and not self._signed(scope):
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
        site = headers.get(b"sec-fetch-site")
        if site is not None and site not in FETCH_SITES:
            raise Forbidden(f"a request from another page ({site.decode('latin-1')[:20]}) is refused: only the page itself may call it")

    def _public(self, scope) -> bool:
        """The page and its scripts, which hold no secret; a wrong ``?token=`` is told at once."""
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            return False
        if scope["path"] == "/":
            token = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
            if token is not None and not self._matches(token[0]):
                raise Forbidden("wrong token: open the address the command printed")
            return True
        return scope["path"].startswith("/static/")

    def _signed(self, scope) -> bool:
        return (scope["type"] == "http" and scope["method"] in ("GET", "HEAD")
                and self.signer.check(scope["path"], scope.get("query_string", b"").decode("latin-1")))

    def _matches(self, given: str | bytes | None) -> bool:
        if given is None:
            return False
        given = given.encode("latin-1", "replace") if isinstance(given, str) else given
        return hmac.compare_digest(given, self.token)

    def _check_token(self, headers: dict) -> None:
        authorization = headers.get(b"authorization", b"")
        if authorization[:7].lower() == b"bearer " and self._matches(authorization[7:].strip()):
            return
        offered = [p.strip() for p in headers.get(b"sec-websocket-protocol", b"").split(b",")]
        if offered[:1] == [SUBPROTOCOL.encode()] and len(offered) == 2 and self._matches(offered[1]):
            return
        raise Forbidden("a valid token is needed: open the address the command printed (http://…/?token=…)")

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
