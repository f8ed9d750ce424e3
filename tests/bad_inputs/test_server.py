"""Catalogue: what a hostile or careless client does to `python PKG serve`, and what the server must do about it.

The real server runs in its own process on 127.0.0.1 and is driven with raw sockets where a client library would
hide what is sent or received. The package is the tiny llama (cpu target) with a 4096-token context, so that one
request can run for seconds (4000 greedy tokens take about 20 s here) while others wait, leave or are refused:

- every request ends in exactly one outcome, a non-streamed one whose client left while it waited in the queue
  included (answered at once, counted in /metrics as 499), and SIGTERM then drains and exits 0 (the server used to
  wait forever on that request, ignoring SIGTERM); a second signal exits at once;
- bodies: over --max-body-bytes (413, from Content-Length before the body is read, or chunked), not JSON (415),
  nested 100,000 deep (400), a client leaving mid-body (499, no traceback); prompts of more characters than the
  context window could hold are refused before tokenizing, while /health answers at once; the server's memory
  after six 10 MB prompts is what it was;
- fields: `seed: -1` is llama-server's random seed, other out-of-range seeds are 400s, `user: 5`, `best_of: true`,
  `n: true` are 400s (they used to be 500s, or accepted silently);
- the Host header must name this server (DNS rebinding), a request head must arrive within 10 s (slow clients), and
  nothing of this puts a traceback in the server's log.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import require_cc, require_module
from serving import free_port, metric, post, raw, rss_mb, start, status_and_body, wait_for
from tiny_package import compile_long_tiny_package

require_module("starlette")
require_module("uvicorn")

COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    require_cc()
    return compile_long_tiny_package(tmp_path_factory.mktemp("serve-hostile"))


def serve(package, *args) -> tuple[str, int, subprocess.Popen]:
    port = free_port()
    proc = start([sys.executable, str(package), "serve", "--port", str(port), "--model-name", "tiny", *args], port)
    return f"http://127.0.0.1:{port}", port, proc


def request(port: int, body, path: str = COMPLETIONS, headers: dict | None = None, host: str | None = None) -> bytes:
    """An HTTP/1.1 request as bytes (JSON body, Content-Length)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = {"Host": host or f"127.0.0.1:{port}", "Content-Type": "application/json", "Content-Length": str(len(data)),
            "Connection": "close", **(headers or {})}
    lines = [f"POST {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items() if v is not None)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def completion(**fields) -> dict:
    return {"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0, **fields}


def stream_in_thread(url: str, max_tokens: int) -> dict:
    """A streamed completion read to its end in a thread: result['chunks'], result['done'] ([DONE] seen)."""
    result = {"chunks": 0, "done": False, "error": None}

    def read():
        import urllib.request

        req = urllib.request.Request(url + COMPLETIONS, json.dumps(completion(max_tokens=max_tokens, stream=True))
                                     .encode(), headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                for line in r:
                    result["chunks"] += line.startswith(b"data: {")
                    result["done"] |= line.strip() == b"data: [DONE]"
        except Exception as e:  # noqa: BLE001 - reported by the test that looks
            result["error"] = repr(e)
    result["thread"] = threading.Thread(target=read, daemon=True)
    result["thread"].start()
    return result


def exit_code(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


# ---- a request abandoned in the queue, then SIGTERM ----------------------------------------------------------

def test_a_queued_request_whose_client_left_ends_and_sigterm_drains(package):
    url, port, proc = serve(package, "--max-num-sequences", "1", "--max-queue", "4", "--shutdown-timeout", "2")
    long = stream_in_thread(url, 3000)  # about 15 s of decoding: the one sequence is busy
    wait_for(lambda: metric(url, "deploycc_running_requests") == 1, 30, "the long request runs")
    abandoned = socket.create_connection(("127.0.0.1", port))
    abandoned.sendall(request(port, completion(max_tokens=8)))
    wait_for(lambda: metric(url, "deploycc_queue_length") == 1, 10, "the second request waits in the queue")
    abandoned.close()
    # Answered (status 499 in the metrics), out of the queue and counted as cancelled while the long one still runs.
    wait_for(lambda: metric(url, f'deploycc_requests_total{{endpoint="{COMPLETIONS}",status="499"}}') == 1, 5,
             "the abandoned request is answered and counted")
    assert metric(url, "deploycc_queue_length") == 0 and metric(url, "deploycc_requests_cancelled_total") == 1
    assert metric(url, "deploycc_running_requests") == 1 and long["thread"].is_alive()
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    code = exit_code(proc, 30)
    took = time.time() - t0
    assert code == 0, (code, proc.stderr.read()[-2000:] if code is not None else "still running after 30 s")
    assert took < 2 + 5, f"SIGTERM took {took:.1f} s with --shutdown-timeout 2"
    long["thread"].join(timeout=10)
    assert long["chunks"] >= 1, long  # it ran until the grace period ended, then was cut
    err = proc.stderr.read()
    assert "Traceback" not in err, err[-3000:]


def test_sigterm_lets_the_requests_in_flight_finish(package):
    url, port, proc = serve(package, "--max-num-sequences", "1", "--shutdown-timeout", "60")
    result = {}

    def whole():  # a second or two alone (200 tokens were over before a fast machine's poll saw them run)
        result["reply"] = post(url + COMPLETIONS, completion(max_tokens=1500), timeout=120)
    t = threading.Thread(target=whole)
    t.start()
    wait_for(lambda: metric(url, "deploycc_running_requests") == 1, 30, "the request runs")
    proc.send_signal(signal.SIGTERM)
    code = exit_code(proc, 90)
    t.join(timeout=10)
    assert code == 0, proc.stderr.read()[-2000:]
    status, body = result["reply"]
    assert status == 200 and body["usage"]["completion_tokens"] == 1500 and body["choices"][0]["finish_reason"] == "length"
    with pytest.raises(OSError):  # the listener is closed
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_a_second_signal_exits_at_once(package):
    url, _, proc = serve(package, "--max-num-sequences", "1", "--shutdown-timeout", "120")
    long = stream_in_thread(url, 3000)
    wait_for(lambda: metric(url, "deploycc_running_requests") == 1, 30, "the long request runs")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None  # draining: the long request has 120 s
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    code = exit_code(proc, 10)
    assert code == 128 + signal.SIGTERM and time.time() - t0 < 3, code
    long["thread"].join(timeout=10)


# ---- bodies, fields, hosts, slow clients: one server ---------------------------------------------------------

@pytest.fixture(scope="module")
def server(package):
    url, port, proc = serve(package, "--max-body-bytes", str(16 << 20))
    yield url, port, proc
    proc.send_signal(signal.SIGTERM)
    assert exit_code(proc, 30) == 0
    err = proc.stderr.read()
    assert "Traceback" not in err and "Exception" not in err, err[-3000:]  # quietly, whatever was sent


def assert_error(status_body, status: int, code: str | None = None, param: str | None = None, text: str = ""):
    got, body = status_body
    assert got == status and set(body) == {"error"}, (got, body)
    assert body["error"]["message"] and text in body["error"]["message"], body
    if code is not None:
        assert body["error"]["code"] == code, body
    if param is not None:
        assert body["error"]["param"] == param, body


@pytest.mark.parametrize("fields,param", [
    ({"seed": -2}, "seed"), ({"seed": 1 << 64}, "seed"), ({"seed": 1.5}, "seed"), ({"seed": True}, "seed"),
    ({"user": 5}, "user"), ({"best_of": True}, "best_of"), ({"n": True}, "n"), ({"logprobs": 21}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"metadata": "x"}, "metadata"), ({"frequency_penalty": False}, "frequency_penalty"),
])
def test_fields_of_the_wrong_type_or_range_are_400(server, fields, param):
    assert_error(post(server[0] + COMPLETIONS, completion(**fields)), 400, param=param)


def test_seed_minus_one_samples_at_random(server):
    """llama-server's spelling of 'no seed' (it used to be a 500); without a seed, each request samples anew."""
    texts = set()
    for fields in ({"seed": -1}, {"seed": -1}, {}, {}):
        status, body = post(server[0] + COMPLETIONS, completion(temperature=1.0, max_tokens=12, **fields))
        assert status == 200, body
        texts.add(body["choices"][0]["text"])
    assert len(texts) > 1
    same = {post(server[0] + COMPLETIONS, completion(temperature=1.0, max_tokens=12, seed=3))[1]["choices"][0]["text"]
            for _ in range(2)}
    assert len(same) == 1


def test_bodies_over_the_limit_are_413(server):
    """A client that sends a body over --max-body-bytes (16 MiB here) gets the 413 (up to 4x the limit the server
    reads and drops the rest: closing with unread bytes would reset the connection and lose the answer); one that
    announces more than 4x gets it before sending anything."""
    url, port, _ = server
    assert_error(post(url + COMPLETIONS, completion(prompt="x" * (20 << 20))), 413, "request_too_large")
    t0 = time.time()
    head = request(port, b"")[:-len(b"\r\n\r\n")].replace(b"Content-Length: 0", f"Content-Length: {65 << 20}".encode())
    response = raw(port, head + b"\r\n\r\n")  # the head alone: no body is sent
    assert_error(status_and_body(response), 413, "request_too_large", text="--max-body-bytes")
    assert time.time() - t0 < 5
    # Chunked, without a length: refused once past the limit.
    chunk = b"x" * (1 << 20)
    chunked = request(port, b"", headers={"Content-Length": None, "Transfer-Encoding": "chunked"})
    chunked += b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(20)) + b"0\r\n\r\n"
    assert_error(status_and_body(raw(port, chunked)), 413, "request_too_large")


@pytest.mark.parametrize("body,ctype,status,code", [
    (b'{"model": "tiny", "prompt": "hi"}', "text/plain", 415, "unsupported_media_type"),
    (b'{"model": "tiny", "prompt": "hi"}', None, 415, "unsupported_media_type"),
    (b"[" * 100_000 + b"]" * 100_000, "application/json", 400, "invalid_json"),  # used to be a 500
    (b'{"model": "tiny", "prompt": "hi", "metadata": {"a": ' + b"[" * 70 + b"1" + b"]" * 70 + b"}}",
     "application/json", 400, "invalid_json"),
    (b'{"model": "tiny", "prompt": "hi"', "application/json", 400, "invalid_json"),
    (b"\xff\xfe{}", "application/json", 400, "invalid_json"),
])
def test_bodies_that_are_not_json_are_refused(server, body, ctype, status, code):
    _, port, _ = server
    assert_error(status_and_body(raw(port, request(port, body, headers={"Content-Type": ctype}))), status, code)


def test_hosts_that_do_not_name_this_server_are_403(server):
    _, port, _ = server
    for host in ("evil.example", f"evil.example:{port}", "localhost.evil.example", f"attacker.test:{port}"):
        assert_error(status_and_body(raw(port, request(port, completion(), host=host))), 403, "invalid_host")
        get = f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
        assert status_and_body(raw(port, get))[0] == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.1", f"[::1]:{port}", f"127.0.0.2:{port}"):
        assert status_and_body(raw(port, request(port, completion(), host=host)))[0] == 200, host
    http10 = b"GET /health HTTP/1.0\r\n\r\n"  # no Host header at all
    assert_error(status_and_body(raw(port, http10)), 400, "invalid_host")


def test_allowed_hosts_option(package):
    url, port, proc = serve(package, "--allowed-hosts", "chat.internal,box:9", "--max-num-sequences", "1")
    try:
        assert status_and_body(raw(port, request(port, completion(), host="chat.internal:1234")))[0] == 200
        assert status_and_body(raw(port, request(port, completion(), host="box:9")))[0] == 200
        assert status_and_body(raw(port, request(port, completion(), host="box:10")))[0] == 403
        assert status_and_body(raw(port, request(port, completion(), host=f"localhost:{port}")))[0] == 403
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def health_latency(url: str, seconds: float) -> list[float]:
    """/health round trips over `seconds` (in a thread: while the test sends something else)."""
    import urllib.request

    times, deadline = [], time.time() + seconds
    while time.time() < deadline:
        t0 = time.perf_counter()
        with urllib.request.urlopen(url + "/health", timeout=30) as r:
            r.read()
        times.append(time.perf_counter() - t0)
        time.sleep(0.02)
    return times


def test_huge_prompts_are_refused_without_stalling_the_server(server):
    """A prompt of more characters than the context window could hold is refused before it is tokenized (it used
    to be tokenized on the event loop: 9.7 s for 10 MB, /health stalled); one that fits the character bound but
    not the window is tokenized off the event loop. /health answers within 2 s all along (the machine may be
    shared with other tests; alone, within milliseconds)."""
    url = server[0]
    latencies = []
    probe = threading.Thread(target=lambda: latencies.extend(health_latency(url, 4)))
    probe.start()
    t0 = time.time()
    for prompt in ("hello " * 1_700_000, "hello " * 10_000):  # 10 MB, and 60,000 characters (~10,000 tokens)
        assert_error(post(url + COMPLETIONS, completion(prompt=prompt)), 400, "context_length_exceeded", "prompt")
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 1_100_000}]}
    assert_error(post(url + "/v1/chat/completions", chat), 400, "context_length_exceeded", "messages")
    assert time.time() - t0 < 10
    probe.join()
    assert latencies and max(latencies) < 2, max(latencies)


def test_six_ten_megabyte_prompts_leave_no_memory_behind(server):
    url, _, proc = server
    post(url + COMPLETIONS, completion(prompt="hello " * 1000))  # warm: the first big body sizes the buffers
    before = rss_mb(proc.pid)
    for i in range(6):
        assert post(url + COMPLETIONS, completion(prompt=f"{i} " + "hello " * 1_700_000))[0] == 400
    grown = rss_mb(proc.pid) - before
    print(f"server RSS {before:.0f} MB before six 10 MB prompts, {before + grown:.0f} MB after")
    assert grown < 24, f"the server kept {grown:.0f} MB after six refused 10 MB prompts"


def test_a_client_that_leaves_mid_body_is_counted_quietly(server):
    url, port, _ = server
    before = metric(url, f'deploycc_requests_total{{endpoint="{COMPLETIONS}",status="499"}}')
    partial = request(port, b"", headers={"Content-Length": "1000"}) + b'{"model": "ti'
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(partial)
        time.sleep(0.3)
    wait_for(lambda: metric(url, f'deploycc_requests_total{{endpoint="{COMPLETIONS}",status="499"}}') == before + 1, 10,
             "the request is counted as its client's leaving")


def test_slow_request_heads_are_closed_quietly(server):
    """Slowloris: connections that send part of a request head and wait. Closed after 10 s; others are served."""
    url, port, _ = server
    socks = []
    for part in (b"", b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"GET /hea"):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(part)
        socks.append(s)
    t0 = time.time()
    assert post(url + COMPLETIONS, completion())[0] == 200
    for s in socks:
        assert s.recv(1024) == b""  # closed by the server, with nothing sent
        s.close()
    took = time.time() - t0
    assert 8 < took < 15, took
