"""Helpers of the server tests (tests/runtime/test_server.py, tests/bad_inputs/test_server.py): the real server in
its own process on 127.0.0.1, raw HTTP where a client library would hide what the server sent, and /metrics."""
from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int, **popen) -> subprocess.Popen:
    """Start a server command and wait until /health answers."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if json.loads(r.read()) == {"status": "ok"}:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("the server did not answer /health within 120 s")


def post(url: str, body, key: str | None = None, headers: dict | None = None, timeout: float = 120
         ) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                          **({"Authorization": f"Bearer {key}"} if key else {}),
                                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def raw(port: int, request: bytes, timeout: float = 30) -> bytes:
    """Send `request` as it is on a new connection; everything the server sends until it closes (`Connection:
    close`; a half-close would end the request early: uvicorn closes at the client's end of file)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        parts = []
        while chunk := s.recv(65536):
            parts.append(chunk)
    return b"".join(parts)


def status_and_body(response: bytes) -> tuple[int, dict | None]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"chunked" in head.lower():  # one chunk is all a JSON error takes
        body = body.split(b"\r\n", 1)[1].rsplit(b"\r\n0\r\n", 1)[0]
    return status, json.loads(body) if body.strip() else None


def metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as m:
        return m.read().decode()


def metric(url: str, name: str) -> int:
    """A counter or gauge of /metrics, labels included in `name` (0 when the series does not exist yet)."""
    return next((int(line.split()[-1]) for line in metrics(url).splitlines() if line.rsplit(" ", 1)[0] == name), 0)


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024


def wait_for(check, timeout: float, what: str, every: float = 0.05):
    """Poll `check()` until it is true (returned); AssertionError naming `what` after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:g} s")


# Two functions for the tool-call tests (tests/runtime/test_tools.py, test_qwen3_server.py): bounded arguments, so
# that a random model's grammar-forced calls end within a few dozen tokens
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}}]
