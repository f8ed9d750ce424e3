"""An OpenAI-compatible HTTP server over one engine: `deploycc serve PKG` and `python PKG serve`.

Starlette (served by uvicorn) answers:

- POST /v1/chat/completions and POST /v1/completions: streamed as server-sent events ending in
  `data: [DONE]`, or whole. Fields: model, messages / prompt, max_tokens (max_completion_tokens), temperature,
  top_p, seed (none or -1: a random one), stop, n = 1, stream, stream_options.include_usage. Without temperature
  or top_p, a request samples with the model's generation_config.json settings, else OpenAI's defaults (temperature
  1, top_p 1); top_k, min_p and the repetition penalty come from generation_config.json alone. Fields the OpenAI
  API defines that this server does not implement are accepted only at their no-op value (presence_penalty 0,
  logprobs false, ...), anything else is a 400 naming the field, never silently ignored
  (runtime/openai_request.py).
- GET /v1/models, GET /health, GET /metrics (Prometheus text).
- GET / and the package's own files, where the package has a browser bundle (`runtime.web` presets) and no
  API key is set: the chat page then runs in the visitor's browser with WebGPU, from the same address. Only
  the files the manifest lists (and the manifest and its seal) are served, by exact path.

Requests run with continuous batching (runtime/batch.py): up to max_num_sequences at once, each in its own
worker thread whose session joins the batched steps of the package's page pool; more wait in a bounded
queue, and a full queue is a 429. Every request ends in exactly one outcome posted to its handler (a reply, an
error, or cancelled) and counted in /metrics: a request whose client disconnects is cancelled at the next token
(its pages go back to the pool at once), or leaves the queue at once if it was waiting (status 499 in
/metrics). A prompt is measured in characters before it is tokenized (more than the context window could
hold is a 400 at once), then tokenized off the event loop, and a prompt longer than the context window is a
400. With an API key, every /v1 call needs `Authorization: Bearer KEY` (401 otherwise; compared in constant
time). Host checks, JSON bodies, size and time limits, slow clients and SIGTERM: runtime/httpserver.py. Every
error has OpenAI's body: {"error": {"message", "type", "param", "code"}}, unexpected ones included (a 500 and
one line in the log). Runs inside a package: imports nothing of deploycc, only starlette and uvicorn.
"""
from __future__ import annotations

import asyncio
import collections
import hmac
import queue
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .batch import Batcher
from .generate import encode_prompt, generate
from .httpserver import HostCheck, HTTPError, read_json, release_heap
from .openai_request import Request, RequestError, parse, shutting_down
from .openai_response import Reply
from .sampler import OPENAI, resolve_sampling
from .tokenizer import TokenizerError


class ServeError(ValueError):
    """The server cannot start (missing packages, a bad port): one line, exit 1."""


@dataclass(frozen=True)
class ServeOptions:
    """How `serve` listens and what it takes (the command lines' options)."""
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queue: int = 16
    max_num_sequences: int | None = None
    shutdown_timeout: float = 5.0  # seconds the requests in flight get after SIGTERM
    max_body_bytes: int = 4 << 20
    allowed_hosts: tuple[str, ...] | None = None  # None: the bound address and localhost names
    header_timeout: float = 10.0  # seconds for a request head to arrive
    body_timeout: float = 30.0  # seconds for a request body to arrive
    log_level: str = "warning"


def allowed_hosts(text: str | None) -> tuple[str, ...] | None:
    """--allowed-hosts a,b:8000 as a tuple (None: the default list)."""
    return None if text is None else tuple(h.strip() for h in text.split(","))


@dataclass(eq=False)  # hashed by identity: the server keeps the running ones in a set
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
    ended: bool = False  # its outcome was posted (by the worker, or by cancel() while it waited)
    reason: str | None = None  # why it was cancelled: "client" (it left) or "shutdown"
    index: int = 0  # the choice it generates (n > 1: the jobs of a request share `out`)
    after: Job | None = None  # the choice whose prompt pages it waits for, to share them (prefix caching)
    prefilled: threading.Event = field(default_factory=threading.Event)  # its prompt's pages are in the pool
    echo: bool = False  # its text starts with the prompt (completions' echo)

    def post(self, kind: str, value) -> None:
        """A piece, or the one outcome (done | error | cancelled), to the handler's queue from any thread."""
        self.loop.call_soon_threadsafe(self.out.put_nowait, (self.index, kind, value))


class JobQueue:
    """The jobs waiting for a worker, in order, at most `maxsize`; one cancelled while it waits leaves at once."""

    def __init__(self, maxsize: int):
        self.maxsize, self.items, self.cond = maxsize, collections.deque(), threading.Condition()
        self.closed = False

    def put(self, job: Job) -> None:
        with self.cond:
            if len(self.items) >= self.maxsize:
                raise queue.Full
            self.items.append(job)
            self.cond.notify()

    def get(self) -> Job | None:
        """The next job (None once closed)."""
        with self.cond:
            while not self.items and not self.closed:
                self.cond.wait()
            return None if self.closed else self.items.popleft()

    def remove(self, job: Job) -> bool:
        with self.cond:
            try:
                self.items.remove(job)
            except ValueError:
                return False
            return True

    def close(self) -> list[Job]:
        """Stop the workers; the jobs that were waiting."""
        with self.cond:
            self.closed, left = True, list(self.items)
            self.items.clear()
            self.cond.notify_all()
        return left

    def qsize(self) -> int:
        return len(self.items)


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

    def __init__(self, engine, model_name: str, options: ServeOptions = ServeOptions()):
        self.engine, self.tokenizer, self.name, self.options = engine, engine.tokenizer, model_name, options
        self.api_key = options.api_key.encode() if options.api_key is not None else None
        self.max_queue = options.max_queue
        self.batcher = Batcher(engine, options.max_num_sequences)
        self.jobs = JobQueue(options.max_queue)
        self.metrics = Metrics()
        self.created = int(time.time())
        self.window = int(engine.context_window)
        # A prompt of more characters than the window's tokens could cover cannot fit: refused untokenized.
        self.max_prompt_chars = self.window * self.tokenizer.max_token_chars
        self.tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="deploycc-tokenize")
        self.running: set[Job] = set()  # under metrics.lock
        self.stopping = False
        self.hosts = HostCheck(options.host, options.port, None if options.allowed_hosts is None
                               else list(options.allowed_hosts))
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
            with self.metrics.lock:
                self.metrics.running += 1
                self.running.add(job)
            session = self.batcher.session()
            session.on_prefill = job.prefilled.set
            outcome = None
            try:
                while job.after is not None and not (job.after.prefilled.wait(0.05) or job.after.ended
                                                     or job.cancelled.is_set()):
                    pass  # the first choice's prompt pages, shared once they are in the pool
                pieces = generate(session, self.tokenizer, job.prompt, chat=job.kind == "chat", stats=job.stats,
                                  ids=job.ids, **job.options)
                text, sent = [], 0  # a whole reply wakes the event loop once, not per token (it shares the cores)
                if job.echo:  # generate prefills before its first piece, so the prompt's entries come first
                    pieces = self._echoed(job, pieces)
                for piece in pieces:
                    if job.cancelled.is_set():
                        pieces.close()  # stats: finish_reason "cancelled"
                        break
                    if job.stream:
                        entries = job.stats.get("logprobs")
                        job.post("piece", (piece, None if entries is None else entries[sent:]))
                        sent = len(entries or ())
                    else:
                        text.append(piece)
                if text:
                    job.post("piece", ("".join(text), None))
                with self.metrics.lock:
                    self.metrics.prompt_tokens += job.stats.get("prompt_tokens", 0)
                    self.metrics.generation_tokens += len(job.stats.get("generated", []))
                    self.metrics.cancelled += job.cancelled.is_set()
                outcome = ("cancelled" if job.cancelled.is_set() else "done", job.stats)
            except Exception as e:  # noqa: BLE001 - one failed request must not stop the server
                outcome = ("error", str(e) or type(e).__name__)
            finally:
                job.prefilled.set()
                session.close()  # its pages go back to the pool now
                with self.metrics.lock:
                    self.metrics.running -= 1
                    self.running.discard(job)
                job.ended = True
                job.post(*(outcome or ("error", "the request was interrupted")))

    @staticmethod
    def _echoed(job: Job, pieces):
        """An echoed reply's pieces: the prompt first (a stream posts it with its log probabilities, which the
        prefill made by the time generate yields its first piece or ends), then the reply's own."""
        rest = iter(pieces)
        first = next(rest, None)
        if job.stream:
            job.post("piece", (job.prompt, job.stats.get("prompt_logprobs")))
        else:
            yield job.prompt
        if first is not None:
            yield first
        yield from rest

    def cancel(self, job: Job, reason: str = "client") -> None:
        """The client left (or the server is stopping): a running job stops at its next token; a waiting one
        leaves the queue now, with its outcome."""
        if not job.cancelled.is_set():
            job.reason = reason
            job.cancelled.set()
        if self.jobs.remove(job):
            self._cancelled_in_queue(job)

    def stop(self) -> None:
        """The grace period after SIGTERM is over: every job ends now (a whole request gets a 503, a stream an
        error event and its end), so that the connections close before the listener's own deadline."""
        self.stopping = True
        with self.metrics.lock:
            running = list(self.running)
        for job in running + list(self.jobs.items):
            self.cancel(job, "shutdown")

    def _cancelled_in_queue(self, job: Job) -> None:
        with self.metrics.lock:
            self.metrics.cancelled += 1
        job.ended = True
        job.post("cancelled", {})

    def close(self) -> None:
        """Stop: the waiting jobs end cancelled, the running ones at their next token, the batcher after."""
        self.stopping = True
        for job in self.jobs.close():
            job.reason, _ = "shutdown", job.cancelled.set()
            self._cancelled_in_queue(job)
        self.tokenize_pool.shutdown(wait=False, cancel_futures=True)
        self.batcher.close()

    # ---- requests -----------------------------------------------------------------------------------

    def check_key(self, request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, b"Bearer " + self.api_key):
            raise RequestError(401, "Incorrect API key provided; pass it as 'Authorization: Bearer KEY'",
                               code="invalid_api_key")

    def encode(self, prompt, kind: str, template_kwargs: dict | None = None) -> list[int]:
        """The prompt's ids, measured against the context window: first its characters (a prompt of more
        than the window could hold is refused without tokenizing it), then its tokens."""
        param = "messages" if kind == "chat" else "prompt"
        chars = len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) + len(str(m.get("tool_calls") or ""))
                                                                for m in prompt)
        chars += len(str((template_kwargs or {}).get("tools") or ""))
        if chars > self.max_prompt_chars:
            raise RequestError(400, f"This model's maximum context length is {self.window} tokens; the prompt is "
                                    f"{chars} characters, more than {self.window} tokens can hold", param,
                               "context_length_exceeded")
        try:
            ids = encode_prompt(self.tokenizer, prompt, chat=kind == "chat", template_kwargs=template_kwargs)
        except TokenizerError as e:
            raise RequestError(400, str(e), param) from None
        finally:
            if chars > 1 << 18:  # what tokenizing a long prompt took goes back to the system now
                release_heap()
        if not ids:
            raise RequestError(400, "the prompt encodes to no tokens", param)
        if len(ids) + 1 > self.window:
            raise RequestError(400, f"This model's maximum context length is {self.window} tokens; the prompt is "
                                    f"{len(ids)} tokens and needs room for at least one more", param,
                               "context_length_exceeded")
        return ids

    def submit(self, kind: str, req: Request, ids: list[int]) -> list[Job]:
        """The jobs of a request's n choices (seeds seed, seed + 1, ...), on one queue; the choices after the first
        start once its prompt is in the pool, and share its pages."""
        if self.stopping:
            raise shutting_down()
        out, jobs = asyncio.Queue(), []
        for i in range(req.n):
            options = {**req.options, "seed": (req.options["seed"] + i) % (1 << 64)} if "seed" in req.options \
                else req.options
            job = Job(kind, req.prompt, ids, options, asyncio.get_running_loop(), out, req.stream, index=i,
                      after=jobs[0] if jobs else None, echo=req.echo)
            try:
                self.jobs.put(job)
            except queue.Full:
                for j in jobs:
                    self.cancel(j)
                raise RequestError(429, f"the server is busy: {self.max_queue} requests are waiting; retry later",
                                   code="server_busy", kind="rate_limit_error") from None
            jobs.append(job)
        return jobs

    # ---- responses ----------------------------------------------------------------------------------

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
                      "# HELP deploycc_requests_cancelled_total Requests cancelled before the end (their client "
                      "left, or the server stopped).",
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
        # what an inference gateway routes on (the Gateway API Inference Extension's model server protocol reads
        # these vLLM names by default): queued and running requests, the fraction of KV-cache pages in use
        usage = round(in_use / cache.pages, 6) if cache.pages else 0.0
        for name, help_text, value in (
                ("num_requests_waiting", "Requests waiting for a worker (as deploycc_queue_length).", self.jobs.qsize()),
                ("num_requests_running", "Requests being generated (as deploycc_running_requests).", running),
                ("kv_cache_usage_perc", "Fraction of KV-cache pages in use, 0 to 1.", usage),
                ("gpu_cache_usage_perc", "Fraction of KV-cache pages in use, 0 to 1 (vLLM's older name).", usage)):
            lines += [f"# HELP vllm:{name} {help_text}", f"# TYPE vllm:{name} gauge", f"vllm:{name} {value}"]
        return "\n".join(lines) + "\n"

    def app(self):
        from starlette.applications import Starlette
        from starlette.requests import ClientDisconnect
        from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
        from starlette.routing import Route

        def error(e: RequestError, endpoint: str):
            self.metrics.count(endpoint, e.status)
            return JSONResponse(e.body(), status_code=e.status)

        def guarded(endpoint: str, handler):
            """Every refusal and failure of `handler` as OpenAI's error body with its status, never a plain 500;
            a client that left while sending is counted (499) and gets nothing."""
            async def handle(request):
                try:
                    response = await handler(request)
                except RequestError as e:
                    response = error(e, endpoint)
                except HTTPError as e:
                    response = error(RequestError(e.status, e.message, code=e.code), endpoint)
                except ClientDisconnect:
                    self.metrics.count(endpoint, 499)
                    response = Response(status_code=499)
                except Exception as e:  # noqa: BLE001 - a bug: one line in the log, the client an error body
                    print(f"error: {request.method} {endpoint}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                    response = error(RequestError(500, f"internal error: {type(e).__name__}", kind="server_error"),
                                     endpoint)
                if getattr(request.state, "body_bytes", 0) > 1 << 20:  # a large body and its text are freed now
                    release_heap()
                return response
            return handle

        def completion_handler(kind: str, endpoint: str):
            async def handle(request):
                self.check_key(request)
                body = await read_json(request, self.options.max_body_bytes, self.options.body_timeout)
                req = parse(body, kind, self.name, self.tokenizer.generation_sampling, self.batcher.max_num_sequences,
                            self.tokenizer)
                ids = await asyncio.get_running_loop().run_in_executor(self.tokenize_pool, self.encode, req.prompt,
                                                                       kind, req.template_kwargs)
                rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
                reply = Reply(self, kind, rid, int(time.time()), self.submit(kind, req, ids), req.include_usage,
                              req.tools)
                if req.stream:
                    self.metrics.count(endpoint, 200)
                    return StreamingResponse(reply.events(), media_type="text/event-stream",
                                             headers={"Cache-Control": "no-cache"})
                watcher = asyncio.create_task(self.watch(request, reply.jobs))
                try:
                    body = await reply.whole()
                finally:
                    watcher.cancel()
                    reply.cancel()  # ended jobs are left alone; the server may be stopping and cancelled this handler
                if body is None:
                    self.metrics.count(endpoint, 499)
                    return Response(status_code=499)
                self.metrics.count(endpoint, 200)
                return JSONResponse(body)
            return guarded(endpoint, handle)

        async def models(request):
            self.check_key(request)
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
                  Route("/v1/models", guarded("/v1/models", models)), Route("/health", health),
                  Route("/metrics", metrics)]
        app = Starlette(routes=routes + self.bundle_routes(), exception_handlers={404: not_found, 405: not_found})

        async def host_checked(scope, receive, send):
            """Every request, whatever its route, names this server in its Host header (DNS rebinding)."""
            if scope["type"] == "http":
                host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
                try:
                    self.hosts(host)
                except HTTPError as e:
                    self.metrics.count(scope["path"] if scope["path"].startswith("/v1/") else "other", e.status)
                    response = JSONResponse(RequestError(e.status, e.message, code=e.code).body(), status_code=e.status)
                    return await response(scope, receive, send)
            return await app(scope, receive, send)
        return host_checked

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

    async def watch(self, request, jobs: list[Job]) -> None:
        """Cancel a whole (non-streamed) request's jobs when its client disconnects."""
        while not all(job.cancelled.is_set() or job.ended for job in jobs):
            if await request.is_disconnected():
                for job in jobs:
                    self.cancel(job)
                return
            await asyncio.sleep(0.25)

def serve(engine, model_name: str, options: ServeOptions = ServeOptions()) -> None:
    """engine: loaded with paged=True (its batched step and page pool)."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ServeError("serving needs starlette and uvicorn: pip install starlette uvicorn") from None
    if not 1 <= options.port <= 65535:
        raise ServeError(f"--port must be between 1 and 65535, got {options.port}")
    for name, value in (("--max-queue", options.max_queue), ("--max-body-bytes", options.max_body_bytes)):
        if value < 1:
            raise ServeError(f"{name} must be at least 1, got {value}")
    if not options.shutdown_timeout >= 0:
        raise ServeError(f"--shutdown-timeout must be 0 or more seconds, got {options.shutdown_timeout}")
    if options.allowed_hosts is not None and not all(h.strip() for h in options.allowed_hosts):
        raise ServeError("--allowed-hosts takes host names (HOST or HOST:PORT) separated by commas, or '*'")
    limit = engine.cache.sequences
    n = options.max_num_sequences
    if n is not None and not 1 <= n <= limit:
        raise ServeError(f"--max-num-sequences must be 1..{limit}, the batch this package was compiled for "
                         f"(recompile with --override max_num_sequences=N for more), got {n}")
    import socket

    host, port = options.host, options.port
    try:  # a port in use or an address not of this machine: one line now, not uvicorn's log after start-up
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror or e}; choose another --port or --host") from None
    server = Server(engine, model_name, options)
    print(f"serving {model_name} on http://{host}:{port}/v1 (OpenAI API; /health, /metrics), up to "
          f"{server.batcher.max_num_sequences} sequences at once", flush=True)
    default = resolve_sampling({}, engine.tokenizer.generation_sampling, OPENAI)
    print(f"a request that sets no temperature or top_p samples with {default.describe()}", flush=True)
    if not engine.tokenizer.chat_template:
        print("this model has no chat template: /v1/chat/completions refuses requests (400), /v1/completions takes "
              "plain text; compile with --chat-template FILE|NAME to give the package one", flush=True)
    from .httpserver import run

    try:
        run(server.app(), host, port, options.log_level, options.shutdown_timeout, options.header_timeout, server.stop)
    finally:
        server.close()
