"""An OpenAI-compatible HTTP server over one engine: `deploycc serve PKG` and `python PKG serve`.

Starlette (served by uvicorn) answers:

- POST /v1/chat/completions and POST /v1/completions: streamed as server-sent events ending in
  `data: [DONE]`, or whole. Fields: model, messages / prompt, max_tokens (max_completion_tokens), temperature,
  top_p, seed, stop, n = 1, stream, stream_options.include_usage. Fields the OpenAI API defines that this
  server does not implement are accepted only at their no-op value (presence_penalty 0, logprobs false, ...),
  anything else is a 400 naming the field, never silently ignored.
- GET /v1/models, GET /health, GET /metrics (Prometheus text).
- GET / and the package's own files, where the package has a browser bundle (`runtime.web` presets) and no
  API key is set: the chat page then runs in the visitor's browser with WebGPU, from the same address. Only
  the files the manifest lists (and the manifest and its seal) are served, by exact path.

Requests run with continuous batching (runtime/batch.py): up to max_num_sequences at once, each in its own
worker thread whose session joins the batched steps of the package's page pool; more wait in a bounded
queue, and a full queue is a 429. A request whose client disconnects is cancelled at the next token and
its pages go back to the pool at once. A prompt longer than the context window is a 400. With an API key,
every /v1 call needs `Authorization: Bearer KEY` (401 otherwise). Errors have OpenAI's body: {"error": {"message", "type",
"param", "code"}}. Runs inside a package: imports nothing of deploycc, only starlette and uvicorn.
"""
from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

from .batch import Batcher
from .generate import encode_prompt, generate

# field -> the value at which an unimplemented OpenAI field changes nothing (accepted), per endpoint
NO_OP = {"frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logprobs": (None, False),
         "top_logprobs": (None, 0), "logit_bias": (None, {}), "user": "any", "parallel_tool_calls": "any",
         "service_tier": (None, "auto", "default"), "store": (None, False), "metadata": "any", "tools": (None, []),
         "tool_choice": (None, "none"), "response_format": (None, {"type": "text"}), "echo": (None, False),
         "suffix": (None,), "best_of": (None, 1)}
COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options"}
FIELDS = {"chat": COMMON | {"messages", "max_completion_tokens"}, "completion": COMMON | {"prompt"}}
ROLES = ("system", "user", "assistant")


class ServeError(ValueError):
    """The server cannot start (missing packages, a bad port): one line, exit 1."""


class RequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def message(i: int, m) -> dict:
    """A chat message as the template takes it: OpenAI's "developer" role is the system prompt, and content
    given as parts joins its text parts (anything but text is refused: this server reads text)."""
    role = m.get("role") if isinstance(m, dict) else None
    role = "system" if role == "developer" else role
    content = m.get("content") if isinstance(m, dict) else None
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise RequestError(400, f"messages[{i}].content: only text parts are supported by this server",
                               "messages", "unsupported_content")
        content = "".join(p["text"] for p in content)
    if role not in ROLES or not isinstance(content, str):
        raise RequestError(400, f"messages[{i}] must be {{'role': one of {', '.join(ROLES)}, 'content': a string or "
                                f"text parts}}", "messages")
    return {"role": role, "content": content}


@dataclass
class Job:
    kind: str  # chat | completion
    prompt: object  # messages or text
    ids: list[int]  # the prompt encoded (by parse, which measured it against the context window)
    options: dict
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    stream: bool = False  # pieces go to the client as they come; else the text goes once, at the end
    cancelled: threading.Event = field(default_factory=threading.Event)
    stats: dict = field(default_factory=dict)


class Metrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.prompt_tokens = self.generation_tokens = self.cancelled = 0
        self.running = 0

    def count(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.requests[endpoint, status] = self.requests.get((endpoint, status), 0) + 1


class Server:
    """The batcher over a paged engine, one worker thread per sequence it may run, the bounded queue and the
    HTTP app."""

    def __init__(self, engine, model_name: str, api_key: str | None = None, max_queue: int = 16,
                 max_num_sequences: int | None = None):
        self.engine, self.tokenizer, self.name = engine, engine.tokenizer, model_name
        self.api_key, self.max_queue = api_key, max_queue
        self.batcher = Batcher(engine, max_num_sequences)
        self.jobs: queue.Queue = queue.Queue(maxsize=max_queue)
        self.metrics = Metrics()
        self.created = int(time.time())
        self.workers = [threading.Thread(target=self._work, name=f"deploycc-request-{i}", daemon=True)
                        for i in range(self.batcher.max_num_sequences)]
        for w in self.workers:
            w.start()

    # ---- the worker threads: one request each at a time, batched together by the batcher ---------------

    def _work(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():
                continue
            with self.metrics.lock:
                self.metrics.running += 1
            session = self.batcher.session()
            try:
                pieces = generate(session, self.tokenizer, job.prompt, chat=job.kind == "chat", stats=job.stats,
                                  ids=job.ids, **job.options)
                text = []  # a whole reply wakes the event loop once, not per token (it shares the cores with steps)
                for piece in pieces:
                    if job.cancelled.is_set():
                        pieces.close()  # stats: finish_reason "cancelled"
                        break
                    if job.stream:
                        job.loop.call_soon_threadsafe(job.out.put_nowait, ("piece", piece))
                    else:
                        text.append(piece)
                if text:
                    job.loop.call_soon_threadsafe(job.out.put_nowait, ("piece", "".join(text)))
                with self.metrics.lock:
                    self.metrics.prompt_tokens += job.stats.get("prompt_tokens", 0)
                    self.metrics.generation_tokens += len(job.stats.get("generated", []))
                    self.metrics.cancelled += job.cancelled.is_set()
                job.loop.call_soon_threadsafe(job.out.put_nowait, ("done", job.stats))
            except Exception as e:  # noqa: BLE001 - one failed request must not stop the server
                job.loop.call_soon_threadsafe(job.out.put_nowait, ("error", str(e) or type(e).__name__))
            finally:
                session.close()  # its pages go back to the pool now
                with self.metrics.lock:
                    self.metrics.running -= 1

    def close(self) -> None:
        for _ in self.workers:
            self.jobs.put(None)
        self.batcher.close()

    # ---- requests -----------------------------------------------------------------------------------

    def check_key(self, request) -> None:
        if self.api_key is None:
            return
        if request.headers.get("authorization", "") != f"Bearer {self.api_key}":
            raise RequestError(401, "Incorrect API key provided; pass it as 'Authorization: Bearer KEY'",
                               code="invalid_api_key")

    def parse(self, body, kind: str) -> tuple[object, list[int], dict, bool, bool]:
        """(prompt, its ids, generate options, stream, include_usage) of a request body, every field checked."""
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        for key, value in body.items():
            if key in FIELDS[kind]:
                continue
            if key in NO_OP and (NO_OP[key] == "any" or value in NO_OP[key]):
                continue
            what = "is not supported by this server" if key in NO_OP else "is not a field of this endpoint"
            raise RequestError(400, f"{key} {what}" + (f" (only {NO_OP[key][-1]!r})" if key in NO_OP else ""), key,
                               "unsupported_parameter")
        model = body.get("model")
        if model != self.name:
            raise RequestError(404, f"The model '{model}' does not exist; this server has '{self.name}'", "model",
                               "model_not_found")
        n = body.get("n", 1)
        if n not in (None, 1):
            raise RequestError(400, "n must be 1: this server returns one choice per request", "n")
        if kind == "chat":
            prompt = body.get("messages")
            if not isinstance(prompt, list) or not prompt:
                raise RequestError(400, "messages must be a non-empty list", "messages")
            prompt = [message(i, m) for i, m in enumerate(prompt)]
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            if not isinstance(prompt, str) or not prompt:
                raise RequestError(400, "prompt must be a non-empty string", "prompt")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = 256 if max_tokens is None else max_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(400, f"max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens")
        options = {"max_tokens": max_tokens, "temperature": 1.0}  # OpenAI's default temperature
        for key, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
            v = body.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi or (key == "top_p" and v == 0):
                raise RequestError(400, f"{key} must be a number in {'(' if key == 'top_p' else '['}{lo}, {hi}], "
                                        f"got {v!r}", key)
            options[key] = float(v)
        seed = body.get("seed")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise RequestError(400, f"seed must be an integer, got {seed!r}", "seed")
            options["seed"] = seed
        stop = body.get("stop")
        if stop is not None:
            stops = [stop] if isinstance(stop, str) else stop
            if not isinstance(stops, list) or not 1 <= len(stops) <= 4 or not all(isinstance(s, str) and s for s in stops):
                raise RequestError(400, "stop must be a non-empty string or a list of 1 to 4 of them", "stop")
            options["stop"] = tuple(stops)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError(400, f"stream must be true or false, got {stream!r}", "stream")
        so = body.get("stream_options")
        if so is not None and (not isinstance(so, dict) or set(so) - {"include_usage"}
                               or not isinstance(so.get("include_usage", False), bool) or not stream):
            raise RequestError(400, "stream_options takes {'include_usage': bool}, with stream true", "stream_options")
        ids = encode_prompt(self.tokenizer, prompt, chat=kind == "chat")
        window = int(self.engine.context_window)
        if not ids:
            raise RequestError(400, "the prompt encodes to no tokens", "messages" if kind == "chat" else "prompt")
        if len(ids) + 1 > window:
            raise RequestError(400, f"This model's maximum context length is {window} tokens; the prompt is "
                                    f"{len(ids)} tokens and needs room for at least one more", "messages" if kind == "chat"
                               else "prompt", "context_length_exceeded")
        return prompt, ids, options, stream, bool((so or {}).get("include_usage", False))

    def submit(self, kind: str, prompt, ids: list[int], options: dict, stream: bool) -> Job:
        job = Job(kind, prompt, ids, options, asyncio.get_running_loop(), asyncio.Queue(), stream)
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise RequestError(429, f"the server is busy: {self.max_queue} requests are waiting; retry later",
                               code="server_busy", kind="rate_limit_error") from None
        return job

    # ---- responses ----------------------------------------------------------------------------------

    def usage(self, stats: dict) -> dict:
        p, c = stats.get("prompt_tokens", 0), len(stats.get("generated", []))
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    @staticmethod
    def finish(stats: dict) -> str:
        return {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}.get(stats.get("finish_reason"),
                                                                                            "stop")

    def metrics_text(self) -> str:
        m = self.metrics
        lines = ["# HELP deploycc_requests_total HTTP requests by endpoint and status.",
                 "# TYPE deploycc_requests_total counter"]
        with m.lock:
            for (endpoint, status), n in sorted(m.requests.items()):
                lines.append(f'deploycc_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            lines += ["# HELP deploycc_prompt_tokens_total Prompt tokens of finished requests.",
                      "# TYPE deploycc_prompt_tokens_total counter", f"deploycc_prompt_tokens_total {m.prompt_tokens}",
                      "# HELP deploycc_generation_tokens_total Tokens generated.",
                      "# TYPE deploycc_generation_tokens_total counter",
                      f"deploycc_generation_tokens_total {m.generation_tokens}",
                      "# HELP deploycc_requests_cancelled_total Requests whose client left before the end.",
                      "# TYPE deploycc_requests_cancelled_total counter",
                      f"deploycc_requests_cancelled_total {m.cancelled}"]
        b, cache = self.batcher, self.engine.cache
        with b.cond:
            stats, running, in_use, idle = dict(b.stats), m.running, cache.pages_in_use, len(cache.idle)
        gauges = [("queue_length", "Requests waiting for a worker.", self.jobs.qsize()),
                  ("running_requests", "Requests being generated.", running),
                  ("batch_size", "Sequences in the last batched step.", stats["batch"]),
                  ("kv_pages_in_use", "KV-cache pages held by sequences.", in_use),
                  ("kv_pages_cached", "KV-cache pages of known prefixes that no sequence holds.", idle),
                  ("kv_pages_total", f"KV-cache pages in the pool ({cache.page_size} tokens each).", cache.pages)]
        counters = [("steps_total", "Batched steps run.", stats["steps"]),
                    ("step_tokens_total", "Tokens computed by batched steps (prompts and decodes).", stats["tokens"]),
                    ("prefix_cache_hit_tokens_total", "Prompt tokens whose keys and values came from cached pages.",
                     stats["prefix_tokens"]),
                    ("preemptions_total", "Sequences whose pages were taken back and that were recomputed.",
                     stats["preempted"])]
        for kind, rows in (("gauge", gauges), ("counter", counters)):
            for name, help_text, value in rows:
                lines += [f"# HELP deploycc_{name} {help_text}", f"# TYPE deploycc_{name} {kind}",
                          f"deploycc_{name} {value}"]
        return "\n".join(lines) + "\n"

    def app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
        from starlette.routing import Route

        def error(e: RequestError, endpoint: str):
            self.metrics.count(endpoint, e.status)
            return JSONResponse(e.body(), status_code=e.status)

        async def body_of(request) -> object:
            try:
                return json.loads(await request.body())
            except (ValueError, UnicodeDecodeError):
                raise RequestError(400, "the request body is not valid JSON") from None

        def completion_handler(kind: str, endpoint: str):
            async def handle(request):
                try:
                    self.check_key(request)
                    prompt, ids, options, stream, include_usage = self.parse(await body_of(request), kind)
                    job = self.submit(kind, prompt, ids, options, stream)
                except RequestError as e:
                    return error(e, endpoint)
                rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
                created = int(time.time())
                if stream:
                    self.metrics.count(endpoint, 200)
                    return StreamingResponse(self.events(job, kind, rid, created, include_usage),
                                             media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
                watcher = asyncio.create_task(self.watch(request, job))
                try:
                    text, stats = await self.collect(job)
                finally:
                    watcher.cancel()
                if stats is None:
                    return error(RequestError(500, f"generation failed: {text}", kind="server_error"), endpoint)
                self.metrics.count(endpoint, 200)
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None}
                          if kind == "chat" else {"index": 0, "text": text, "logprobs": None})
                choice["finish_reason"] = self.finish(stats)
                return JSONResponse({"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
                                     "created": created, "model": self.name, "choices": [choice],
                                     "usage": self.usage(stats)})
            return handle

        async def models(request):
            try:
                self.check_key(request)
            except RequestError as e:
                return error(e, "/v1/models")
            self.metrics.count("/v1/models", 200)
            return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model",
                                                             "created": self.created, "owned_by": "deploycc"}]})

        async def health(request):
            return JSONResponse({"status": "ok"})

        async def metrics(request):
            return PlainTextResponse(self.metrics_text(), media_type="text/plain; version=0.0.4")

        async def not_found(request, exc):
            return JSONResponse(RequestError(404, f"no route {request.method} {request.url.path}").body(),
                                status_code=404)

        routes = [Route("/v1/chat/completions", completion_handler("chat", "/v1/chat/completions"), methods=["POST"]),
                  Route("/v1/completions", completion_handler("completion", "/v1/completions"), methods=["POST"]),
                  Route("/v1/models", models), Route("/health", health), Route("/metrics", metrics)]
        return Starlette(routes=routes + self.bundle_routes(), exception_handlers={404: not_found, 405: not_found})

    def bundle_routes(self) -> list:
        """GET / and the package's files for its browser bundle (none with an API key: the page has no key to send,
        and the weights are not for everyone who can reach an API that wants one)."""
        from starlette.responses import FileResponse, JSONResponse
        from starlette.routing import Route

        root = getattr(self.engine, "path", None)
        files = set(getattr(self.engine, "manifest", {}).get("files", {}))
        if root is None or "index.html" not in files or self.api_key:
            return []
        files |= {"manifest.json", "manifest.sha256"}

        async def static(request):
            path = request.path_params.get("path") or "index.html"
            if path not in files:
                return JSONResponse(RequestError(404, f"no file {path} in this package").body(), status_code=404)
            return FileResponse(root / path, headers={"Cache-Control": "no-cache"})
        return [Route("/", static), Route("/{path:path}", static)]

    async def watch(self, request, job: Job) -> None:
        """Cancel a whole (non-streamed) request when its client disconnects."""
        while not job.cancelled.is_set():
            if await request.is_disconnected():
                job.cancelled.set()
                return
            await asyncio.sleep(0.25)

    async def collect(self, job: Job) -> tuple[str, dict | None]:
        parts = []
        while True:
            kind, value = await job.out.get()
            if kind == "piece":
                parts.append(value)
            elif kind == "done":
                return "".join(parts), value
            else:
                return value, None

    async def events(self, job: Job, kind: str, rid: str, created: int, include_usage: bool):
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

        def chunk(choice: dict | None, usage: dict | None = None) -> str:
            body = {"id": rid, "object": obj, "created": created, "model": self.name,
                    "choices": [] if choice is None else [choice]}
            if include_usage:
                body["usage"] = usage
            return f"data: {json.dumps(body)}\n\n"

        def choice(text: str | None, finish: str | None) -> dict:
            if kind == "chat":
                delta = {} if text is None else {"content": text}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

        try:
            if kind == "chat":
                yield chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None})
            while True:
                what, value = await job.out.get()
                if what == "piece":
                    yield chunk(choice(value, None))
                elif what == "done":
                    yield chunk(choice(None, self.finish(value)))
                    if include_usage:
                        yield chunk(None, self.usage(value))
                    break
                else:
                    yield f"data: {json.dumps(RequestError(500, value, kind='server_error').body())}\n\n"
                    break
            yield "data: [DONE]\n\n"
        finally:  # the client left (the response was cancelled) or the stream ended: free the engine
            job.cancelled.set()


def serve(engine, model_name: str, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          max_queue: int = 16, max_num_sequences: int | None = None, log_level: str = "warning") -> None:
    """engine: loaded with paged=True (its batched step and page pool)."""
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        raise ServeError("serving needs starlette and uvicorn: pip install starlette uvicorn") from None
    if not 1 <= port <= 65535:
        raise ServeError(f"--port must be between 1 and 65535, got {port}")
    if max_queue < 1:
        raise ServeError(f"--max-queue must be at least 1, got {max_queue}")
    limit = engine.cache.sequences
    if max_num_sequences is not None and not 1 <= max_num_sequences <= limit:
        raise ServeError(f"--max-num-sequences must be 1..{limit}, the batch this package was compiled for "
                         f"(recompile with --override max_num_sequences=N for more), got {max_num_sequences}")
    import socket

    try:  # a port in use or an address not of this machine: one line now, not uvicorn's log after start-up
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port or --host") from None
    server = Server(engine, model_name, api_key, max_queue, max_num_sequences)
    print(f"serving {model_name} on http://{host}:{port}/v1 (OpenAI API; /health, /metrics), up to "
          f"{server.batcher.max_num_sequences} sequences at once", flush=True)
    try:
        uvicorn.run(server.app(), host=host, port=port, log_level=log_level)
    finally:
        server.close()
