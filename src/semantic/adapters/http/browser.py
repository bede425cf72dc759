"""What a browser may ask of a local server: the ``Host``, ``Origin`` and body type checks.

A server on 127.0.0.1 is reachable by every web page its user opens (docs/adr/0016). A page
from another site can send a "simple" request, which no preflight guards (``text/plain``,
a form, multipart): the browser sends it and only hides the answer, so the request's
effect lands. A page can also read answers by DNS rebinding: its own name, re-resolved to
127.0.0.1, makes the browser treat the server as the page's own origin. The browser always
says who is asking, so:

- ``Host`` must name the server as its user does: a loopback name, an IP address (an
  address is not re-resolved, so it cannot be rebound: a browser sends it only to the
  machine that has it), the bound name, or a name given with ``--allowed-host``; else 421.
- An ``Origin`` must be the server's own or one named with ``--cors-origin``; else 403. A
  browser sends one with every request but a plain GET, and a cross-site GET without one
  (``Sec-Fetch-Site: cross-site``, not a navigation) is refused too. SDKs and curl send
  none and are not browsers.
- A body is JSON and says so: a form or plain text is refused (415), whoever sends it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from semantic.adapters.http.errors import Problem

ANY = "*"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

Headers = Mapping[bytes, bytes]


@dataclass(frozen=True, slots=True)
class BrowserPolicy:
    """The host names and web origins a server answers."""

    hosts: frozenset[str]
    origins: frozenset[str]

    @classmethod
    def of(cls, allowed_hosts: Iterable[str], cors_origins: Iterable[str]) -> BrowserPolicy:
        """``allowed_hosts`` besides the loopback names (with a port or not; ``*``: any);
        ``cors_origins`` as ``--cors-origin`` takes them (``*``: any)."""
        names = {host_name(host.encode()) for host in (*LOOPBACK_NAMES, *allowed_hosts) if host}
        return cls(
            frozenset(name for name in names if name),
            frozenset(_origin(origin) for origin in cors_origins),
        )

    def host_problem(self, headers: Headers) -> Problem | None:
        host = headers.get(b"host")
        if host is None or ANY in self.hosts:  # HTTP/1.0 without one: not a browser
            return None
        name = host_name(host)
        if name is not None and (name in self.hosts or _is_address(name)):
            return None
        shown = host.decode("latin-1")[:100]
        return Problem(
            421,
            "host_not_allowed",
            f"this server does not answer for the host {shown!r} (a web page on another "
            "site may be using DNS rebinding); call it by a loopback name or an address, or "
            f"start it with --allowed-host {_bare(shown)} if that name is really its own",
        )

    def origin_problem(self, scheme: str, headers: Headers) -> Problem | None:
        origin = headers.get(b"origin")
        if origin is None:
            cross_site = headers.get(b"sec-fetch-site") == b"cross-site"
            if cross_site and headers.get(b"sec-fetch-mode") != b"navigate":
                return Problem(403, "origin_not_allowed", "a cross-site browser request is refused")
            return None
        seen = _origin(origin.decode("latin-1"))
        if ANY in self.origins or seen in self.origins or seen == _own_origin(scheme, headers):
            return None
        return Problem(
            403,
            "origin_not_allowed",
            f"requests from the web origin {seen[:100]!r} are refused: a page there may call "
            f"this server only if it was started with --cors-origin {seen[:100]}",
        )


def json_problem(method: str, headers: Headers) -> Problem | None:
    """A request with a body must say it is JSON: every route takes JSON, and the types a
    browser may send cross-site unasked (plain text, forms) are exactly the others."""
    if method not in _BODY_METHODS:
        return None
    given = headers.get(b"content-type")
    if given is None:
        length = headers.get(b"content-length", b"0").strip()
        if length in (b"", b"0") and b"transfer-encoding" not in headers:
            return None  # no body at all: the route says what it misses
        return Problem(
            415,
            "unsupported_media_type",
            "the request has a body but no Content-Type; send it as application/json",
        )
    media = given.split(b";", 1)[0].strip().lower()
    if media == b"application/json" or media.endswith(b"+json"):
        return None
    return Problem(
        415,
        "unsupported_media_type",
        f"the Content-Type {given.decode('latin-1')[:100]!r} is not JSON; send the body as "
        "application/json",
    )


def host_name(value: bytes) -> str | None:
    """The name in a ``Host`` header (``name``, ``name:port``, ``[v6]:port``), lowercased,
    without a port or a final dot; None for one that is no host at all."""
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        name, bracket, port = text[1:].partition("]")
        if not bracket or (port and not (port[:1] == ":" and port[1:].isdigit())):
            return None
        return name or None
    if text.count(":") > 1:  # an IPv6 address given bare, as --allowed-host may be
        return text
    name, colon, port = text.partition(":")
    if colon and not port.isdigit():
        return None
    return name.rstrip(".") or None


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _own_origin(scheme: str, headers: Headers) -> str | None:
    """The origin of a page this server served itself (its ``/schema`` page, say)."""
    host = headers.get(b"host")
    return None if host is None else _origin(f"{scheme}://{host.decode('latin-1')}")


def _origin(text: str) -> str:
    return text.strip().rstrip("/").lower()


def _bare(host: str) -> str:
    name = host_name(host.encode("latin-1"))
    return name if name else "NAME"
