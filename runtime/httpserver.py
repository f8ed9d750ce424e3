"""The HTTP layer under the API server (runtime/server.py): what a server on a laptop must refuse before any
model work, and how it starts and stops.

- Host checks (DNS rebinding): a page on another site can make a browser send requests to 127.0.0.1 under the
  site's own name once its DNS answer changes; only the Host header tells such a request apart. Every request
  must name an allowed host: by default the address the server binds, localhost, 127.0.0.1 and [::1], and any
  IP literal (a rebinding attack needs a name); --allowed-hosts replaces the list, `*` allows any. The same
  defence as Jupyter's and as llama-server-style local servers'.
- Bodies: JSON only (`Content-Type: application/json`, so a cross-site form or `text/plain` post is refused
  before the browser's CORS check would even apply), at most `max_body_bytes` (413 from Content-Length, or as
  soon as a chunked body passes it), read within `body_timeout` seconds (408), nested at most MAX_JSON_DEPTH
  deep. An oversized body of up to DRAIN_FACTOR times the limit is read and dropped before the 413, so that a
  client still sending it gets the answer rather than a reset connection (nginx's lingering close); a larger one
  is refused at once.
- Slow clients: a connection that has not sent a whole request head within `header_timeout` seconds is closed,
  quietly (uvicorn only times out idle keep-alive connections, after a first response).
- Signals: the first SIGTERM or SIGINT stops accepting connections and gives the requests in flight
  `shutdown_timeout` seconds to finish; what is left is cancelled and the process exits 0. A second signal exits
  at once (status 128 + signal).
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import signal
import socket
import sys

MAX_JSON_DEPTH = 64
DRAIN_FACTOR = 4
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


class HTTPError(Exception):
    """A request refused by the HTTP layer: status and message (the API server renders OpenAI's error body)."""

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def split_host(value: str) -> tuple[str, int | None]:
    """('name', port) of a Host header or an --allowed-hosts entry; IPv6 literals in brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
    return name.rstrip("."), int(port) if port.isdigit() else None


class HostCheck:
    """Whether a request's Host header names this server (see the module docstring)."""

    def __init__(self, bind_host: str, port: int, allowed: list[str] | None = None):
        self.any = allowed is not None and "*" in allowed
        if allowed is None:
            names = {*LOCAL_NAMES, bind_host.lower().strip("[]")}
            if bind_host in ("", "0.0.0.0", "::"):  # every interface: the names this machine goes by too
                names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
            allowed = [f"[{n}]:{port}" if ":" in n else f"{n}:{port}" for n in names]
        self.allowed = {split_host(a) for a in allowed if a != "*"}

    def __call__(self, host: str | None) -> None:
        if self.any:
            return
        if not host:
            raise HTTPError(400, "the request has no Host header", "invalid_host")
        name, port = split_host(host)
        try:
            ipaddress.ip_address(name)
            return  # an IP literal: no name a rebinding attack could have turned into this machine
        except ValueError:
            pass
        if (name, port) in self.allowed or (name, None) in self.allowed:
            return
        raise HTTPError(403, f"the Host header {host!r} does not name this server; start it with --allowed-hosts "
                             f"{name} to allow it", "invalid_host")


def json_depth(value) -> int:
    """How deeply lists and objects nest in a parsed JSON value (iterative: no recursion limit to hit)."""
    depth, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            depth = max(depth, d)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return depth


async def read_json(request, max_bytes: int, timeout: float) -> object:
    """The request's JSON body, within the limits of the module docstring (HTTPError otherwise; a client that
    leaves while sending raises starlette's ClientDisconnect)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise HTTPError(415, f"the request body must be JSON with 'Content-Type: application/json', got "
                             f"{ctype or 'no Content-Type'!r}", "unsupported_media_type")
    length = request.headers.get("content-length")
    too_large = HTTPError(413, f"the request body is {length or 'over ' + str(max_bytes)} bytes; this server takes "
                               f"at most {max_bytes} (--max-body-bytes)", "request_too_large")
    if length is not None and not length.isdigit():
        raise HTTPError(400, f"Content-Length {length!r} is not a number of bytes", "invalid_request")

    async def read() -> bytes:
        parts, size = [], 0
        drain = length is not None and int(length) > max_bytes
        if drain and int(length) > DRAIN_FACTOR * max_bytes:
            raise too_large
        async for part in request.stream():
            size += len(part)
            if size > DRAIN_FACTOR * max_bytes:
                raise too_large
            drain = drain or size > max_bytes
            if not drain:
                parts.append(part)
        if drain:
            raise too_large
        return b"".join(parts)

    try:
        data = await asyncio.wait_for(read(), timeout)
        request.state.body_bytes = len(data)
    except asyncio.TimeoutError:
        raise HTTPError(408, f"the request body did not arrive within {timeout:g} s", "request_timeout") from None
    try:
        value = json.loads(data)
    except RecursionError:
        raise HTTPError(400, f"the request body nests more than {MAX_JSON_DEPTH} levels deep", "invalid_json") from None
    except (ValueError, UnicodeDecodeError):
        raise HTTPError(400, "the request body is not valid JSON", "invalid_json") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise HTTPError(400, f"the request body nests more than {MAX_JSON_DEPTH} levels deep", "invalid_json")
    return value


def release_heap() -> None:
    """Give the C heap's free memory back to the system now (glibc's malloc_trim; nothing elsewhere): after a large
    body, glibc keeps what it freed for reuse, and a server's memory would grow to its largest requests."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def run(app, host: str, port: int, log_level: str, shutdown_timeout: float, header_timeout: float,
        end_grace) -> None:
    """Serve `app` with uvicorn until a signal (see the module docstring). `end_grace()` is called in the event
    loop `shutdown_timeout` seconds after the first signal: it must end what is still running, so that the
    connections close (uvicorn cancels what is left a little later, noisily)."""
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        """uvicorn's h11 protocol with a deadline for each request head (slowloris), from the connection's
        first byte or the end of the previous response; closed quietly when it passes."""

        head_timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def _waiting_for_head(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self.head_timer is None:
                self.head_timer = self.loop.call_later(header_timeout, self._expire)

        def _disarm(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _expire(self) -> None:
            self.head_timer = None
            if self._waiting_for_head() and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._waiting_for_head():
                self._arm()
            super().data_received(data)
            if not self._waiting_for_head():
                self._disarm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame) -> None:
            if self.should_exit:
                print(f"{signal.Signals(sig).name} again: exiting now", file=sys.stderr, flush=True)
                os._exit(128 + sig)
            print(f"{signal.Signals(sig).name}: finishing the requests in flight (at most {shutdown_timeout:g} s; "
                  f"send it again to exit now)", file=sys.stderr, flush=True)
            self.should_exit = True
            loop = asyncio.get_event_loop()
            loop.call_soon_threadsafe(loop.call_later, shutdown_timeout, end_grace)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, http=Protocol,
                            timeout_graceful_shutdown=shutdown_timeout + 3, timeout_keep_alive=5)
    Server(config).run()
