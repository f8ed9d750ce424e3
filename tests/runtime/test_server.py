"""`python PKG serve` / `deploycc serve`: the real server on 127.0.0.1 in its own process, driven by the
official `openai` client (and raw HTTP where the client would hide the status).

A tiny llama package (native cpu target, byte-level BPE tokenizer, ChatML template) answers: greedy chat
and completions, whole and streamed, equal to `python PKG run` (the package's single-sequence engine); the
usage counts; /v1/models, /health, /metrics; every refusal with its status and OpenAI's error body (unknown
model, unsupported and malformed fields, a prompt past the context window, a wrong or missing key, n > 1);
backpressure (429 beyond --max-num-sequences running and --max-queue waiting); and a minute of 16 streaming
clients batched together (continuous batching over the paged KV cache): no errors, every greedy stream equal
to its solo run, every KV page back in the pool, memory flat. SmolLM2 (marked `model`): the chat answer
equals `deploycc run`'s, and a streamed request whose client leaves is cancelled, freeing its pages.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import serving
from conftest import require_cc, require_module
from serving import free_port, metric, rss_mb, start
from tiny_package import compile_tiny_package

openai = require_module("openai")
require_module("starlette")
require_module("uvicorn")

KEY = "sk-test-123"
PROMPT = "hello world"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    require_cc()
    return compile_tiny_package(tmp_path_factory.mktemp("serve"), "cpu")


@pytest.fixture(scope="module")
def server(package):
    port = free_port()
    proc = start([sys.executable, str(package), "serve", "--port", str(port), "--api-key", KEY, "--max-queue", "2",
                  "--max-num-sequences", "1", "--model-name", "tiny"], port)
    yield f"http://127.0.0.1:{port}", proc
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=120)


def run_alone(package: Path, prompt: str, max_tokens: int, chat: bool = True) -> str:
    args = [sys.executable, str(package), "run", "--prompt", prompt, "--max-tokens", str(max_tokens), "--json",
            "--temperature", "0"]
    r = subprocess.run(args + ([] if chat else ["--no-chat"]), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)["text"]


def post(url: str, body, key: str | None = KEY) -> tuple[int, dict]:
    return serving.post(url, body, key)


def test_chat_whole_and_streamed_equal_a_solo_run(client, package):
    want = run_alone(package, PROMPT, 12)
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=12,
                                       temperature=0)
    assert r.object == "chat.completion" and r.model == "tiny" and len(r.choices) == 1
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                                 max_tokens=12, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == r.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == r.usage.total_tokens


def test_text_parts_and_the_developer_role(client):
    """Clients that send content as a list of text parts, and OpenAI's "developer" role for the system prompt,
    get the answer of the plain form."""
    plain = client.chat.completions.create(model="tiny", temperature=0, max_tokens=8, messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}])
    parts = client.chat.completions.create(model="tiny", temperature=0, max_tokens=8, messages=[
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}])
    assert parts.choices[0].message.content == plain.choices[0].message.content


def test_completions_whole_and_streamed(client, package):
    want = run_alone(package, PROMPT, 10, chat=False)
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == want
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=10, temperature=0, stream=True) if c.choices)
    assert streamed == want


def test_stop_and_seeded_sampling(client):
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
    cut = full[3:6]
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, stop=[cut])
    assert r.choices[0].text == full[:full.index(cut)] and r.choices[0].finish_reason == "stop"
    a, b = (client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, top_p=0.9, seed=7)
            for _ in range(2))
    assert a.choices[0].text == b.choices[0].text  # the same seed, the same sample
    others = {client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, top_p=0.9,
                                        seed=s).choices[0].text for s in (8, 9, 10)}
    assert len(others | {a.choices[0].text}) > 1  # other seeds, other samples: temperature and seed take effect


def test_models_health_metrics(client, server):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    with urllib.request.urlopen(server[0] + "/metrics", timeout=10) as r:
        text = r.read().decode()
    for name in ("deploycc_requests_total", "deploycc_generation_tokens_total", "deploycc_queue_length",
                 "deploycc_running_requests", "deploycc_batch_size", "deploycc_kv_pages_in_use",
                 "deploycc_kv_pages_total", "deploycc_kv_pages_cached", "deploycc_steps_total",
                 "deploycc_prefix_cache_hit_tokens_total", "deploycc_preemptions_total"):
        assert f"\n{name}" in "\n" + text, name
    assert metric(server[0], "deploycc_kv_pages_in_use") == 0 and metric(server[0], "deploycc_kv_pages_total") > 0
    assert 'deploycc_requests_total{endpoint="/v1/chat/completions",status="200"}' in text


@pytest.mark.parametrize("body,status,param,code", [
    ({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}, 404, "model", "model_not_found"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "presence_penalty": 0.5}, 400,
     "presence_penalty", "unsupported_parameter"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}, 400, "frobnicate",
     "unsupported_parameter"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n", None),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 3}, 400, "temperature", None),
    ({"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages", None),
    ({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages", "unsupported_content"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi " * 400}]}, 400, "messages",
     "context_length_exceeded"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens", None),
])
def test_bad_requests(server, body, status, param, code):
    got, err = post(server[0] + "/v1/chat/completions", body)
    assert got == status and set(err) == {"error"}, err
    assert err["error"]["param"] == param and err["error"]["code"] == code and err["error"]["message"]


def test_no_op_fields_are_accepted(client):
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       temperature=0, presence_penalty=0, frequency_penalty=0, user="u1")
    assert r.choices[0].message.content is not None


def test_keys_and_malformed_bodies(server):
    url = server[0] + "/v1/chat/completions"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    for key in (None, "sk-wrong"):
        got, err = post(url, body, key)
        assert got == 401 and err["error"]["code"] == "invalid_api_key"
    got, err = post(url, b"{not json")
    assert got == 400 and "not valid JSON" in err["error"]["message"]
    got, err = post(server[0] + "/v1/embeddings", body)
    assert got == 404 and err["error"]["message"]
    bad = openai.OpenAI(base_url=server[0] + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_a_full_queue_is_429(client):
    """--max-num-sequences 1 --max-queue 2: with one request running and two waiting, more are refused with 429
    (rate_limit_error)."""
    statuses, lock = [], threading.Lock()

    def one():
        try:
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=60, temperature=0)
            s = 200
        except openai.RateLimitError:
            s = 429
        with lock:
            statuses.append(s)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert 429 in statuses and statuses.count(200) >= 3, statuses


LOAD_PROMPTS = ["hello world", "the quick brown fox", "tell me a story", "one two three four"]


SOAK_S = float(os.environ.get("DEPLOYCC_SOAK_S", 30))  # the load test's length (60 and more by hand)


def test_sixteen_streaming_clients_for_half_a_minute(package):
    """16 concurrent streaming chat clients for SOAK_S seconds (loopback, 16 sequences batched): no errors, steps that
    batch several sequences, every greedy stream equal to its prompt's solo run (`python PKG run`, and the
    server's own answer to that client alone), every KV page back in the pool at the end, and the server's
    resident memory flat (within 16 MB of its size after the first round of requests)."""
    solo = {p: run_alone(package, p, 16) for p in LOAD_PROMPTS}
    port = free_port()
    proc = start([sys.executable, str(package), "serve", "--port", str(port), "--max-queue", "16",
                  "--model-name", "tiny"], port)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        errors, mismatches, done, lock = [], [], [0], threading.Lock()

        def stream(prompt: str) -> str:
            chunks = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                                    max_tokens=16, temperature=0, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        for p in LOAD_PROMPTS:  # the first round: the server's memory after it is the baseline
            assert stream(p) == solo[p]
        baseline = rss_mb(proc.pid)
        deadline = time.time() + SOAK_S

        def worker(i: int):
            n = i
            while time.time() < deadline:
                prompt = LOAD_PROMPTS[n % len(LOAD_PROMPTS)]
                n += 1
                try:
                    text = stream(prompt)
                except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                    with lock:
                        errors.append(repr(e)[:200])
                    continue
                with lock:
                    done[0] += 1
                    if text != solo[prompt]:
                        mismatches.append((prompt, text))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        url, batches = f"http://127.0.0.1:{port}", []
        while any(t.is_alive() for t in threads):  # the sequences of the running step, sampled
            batches.append(metric(url, "deploycc_batch_size"))
            time.sleep(0.5)
        for t in threads:
            t.join(timeout=400)
        assert not errors, errors[:3]
        assert not mismatches, mismatches[:3]
        assert done[0] >= 16
        assert max(batches) >= 2, "no step batched several sequences"
        assert metric(url, "deploycc_kv_pages_in_use") == 0  # every finished sequence gave its pages back
        assert metric(url, "deploycc_prefix_cache_hit_tokens_total") > 0  # repeated prompts shared their pages
        grown = rss_mb(proc.pid) - baseline
        assert grown <= 16, f"the server grew by {grown:.1f} MB over {done[0]} requests"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def one_line_error(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    return lines[0]


def test_deploycc_serve_refuses_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "deploycc", "serve", str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert "--device" in one_line_error(r)


def test_serve_refuses_a_port_in_use_and_a_bad_queue(package, server):
    port = server[0].rsplit(":", 1)[1]  # the module's server holds it
    r = subprocess.run([sys.executable, str(package), "serve", "--port", port], capture_output=True, text=True,
                       timeout=120)
    assert f"cannot listen on 127.0.0.1:{port}" in one_line_error(r)
    r = subprocess.run([sys.executable, str(package), "serve", "--max-queue", "0"], capture_output=True, text=True,
                       timeout=120)
    assert "--max-queue must be at least 1" in one_line_error(r)
    r = subprocess.run([sys.executable, str(package), "serve", "--max-num-sequences", "999"], capture_output=True,
                       text=True, timeout=120)
    assert "--max-num-sequences must be 1.." in one_line_error(r)


@pytest.mark.model
def test_smollm2_chat_equals_deploycc_run(smollm2_cpu_package):
    pkg = smollm2_cpu_package  # the default cpu package (tests/conftest.py), shared with tests/models
    question = "What is the capital of France?"
    r = subprocess.run([sys.executable, "-m", "deploycc", "run", str(pkg), "--prompt", question, "--max-tokens", "24",
                        "--temperature", "0", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    want = json.loads(r.stdout)["text"]
    port = free_port()
    proc = start([sys.executable, "-m", "deploycc", "serve", str(pkg), "--port", str(port)], port)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        got = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": question}],
                                             max_tokens=24, temperature=0)
        assert got.choices[0].message.content == want
        # A streamed request whose client leaves after the first chunk stops at its next token (its 400 tokens
        # would take about a second): the engine is free for the next request, and the metrics count it.
        url = f"http://127.0.0.1:{port}"
        before = metric(url, "deploycc_generation_tokens_total")
        stream = client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=400,
                                           temperature=0, stream=True)
        next(iter(stream))
        stream.close()
        r = client.completions.create(model="smollm2", prompt="Hi", max_tokens=1, temperature=0)
        assert r.usage.completion_tokens == 1
        assert metric(url, "deploycc_requests_cancelled_total") == 1
        assert metric(url, "deploycc_generation_tokens_total") - before < 400
        deadline = time.time() + 10  # the cancelled sequence's pages are back in the pool
        while metric(url, "deploycc_kv_pages_in_use") and time.time() < deadline:
            time.sleep(0.1)
        assert metric(url, "deploycc_kv_pages_in_use") == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
