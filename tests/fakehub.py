"""A fake Hugging Face Hub on 127.0.0.1, serving repos from local files, for download tests.

It implements exactly the endpoints that `huggingface_hub.snapshot_download` uses (read from its
source: `HfApi.model_info`, `HfApi.list_repo_tree`, `get_hf_file_metadata`, `http_get`):

  GET       /api/models/{org}/{name}[/revision/{rev}]     {"id", "sha", "siblings"}
  GET       /api/models/{org}/{name}/tree/{rev}[/{path}]  [{"type": "file", "path", "size", "oid"}, ...]
  HEAD, GET /{org}/{name}/resolve/{rev}/{file}            X-Repo-Commit, ETag, Content-Length; the bytes
  GET       /api/agent-harnesses                          an empty registry (the client's user agent asks)

A missing repo, revision or file is a 404 with the `X-Error-Code` the client turns into
RepositoryNotFoundError, RevisionNotFoundError or RemoteEntryNotFoundError. A revision is a branch or
tag name, or the 40-hex commit it points to. No xet headers are sent, so the client downloads over
plain HTTP. Every request is counted by (method, path), so tests can assert what was fetched.

    with FakeHub({"org/tiny": {"main": dir_a, "v1": dir_b}}) as hub:
        env = {"HF_ENDPOINT": hub.url, ...}
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

Files = dict[str, bytes]  # path in repo -> content


def read_tree(root: Path) -> Files:
    """Every file under `root` by its '/'-separated relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def commit_sha(repo_id: str, revision: str, files: Files) -> str:
    """A stable 40-hex commit id for one revision's file set."""
    h = hashlib.sha1(f"{repo_id}@{revision}".encode())
    for path, data in sorted(files.items()):
        h.update(path.encode() + b"\0" + hashlib.sha1(data).digest())
    return h.hexdigest()


class FakeHub:
    """A Hub with `repos` = {repo_id: {revision: directory or Files}}; a context manager."""

    def __init__(self, repos: dict[str, dict[str, Path | Files]]):
        self.repos: dict[str, dict[str, tuple[str, Files]]] = {}
        for repo_id, revisions in repos.items():
            self.repos[repo_id] = {}
            for rev, src in revisions.items():
                files = read_tree(Path(src)) if isinstance(src, (str, Path)) else dict(src)
                self.repos[repo_id][rev] = (commit_sha(repo_id, rev, files), files)
        self.requests: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- what tests look at -----------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "the hub is not running"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def sha(self, repo_id: str, revision: str = "main") -> str:
        return self.repos[repo_id][revision][0]

    def downloaded(self, repo_id: str) -> Counter[str]:
        """How often each file of `repo_id` was fetched (GET on /resolve), at any revision."""
        prefix = f"/{repo_id}/resolve/"
        out: Counter[str] = Counter()
        with self._lock:
            for (method, path), n in self.requests.items():
                if method == "GET" and path.startswith(prefix):
                    out[path[len(prefix):].split("/", 1)[1]] += n
        return out

    def total_requests(self) -> int:
        with self._lock:
            return sum(self.requests.values())

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fakehub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- routing: (status, headers, body) for one request --------------------------------------

    def _revision(self, repo_id: str, rev: str) -> tuple[str, Files] | None:
        for name, (sha, files) in self.repos[repo_id].items():
            if rev in (name, sha):
                return sha, files
        return None

    def respond(self, method: str, path: str, query: dict[str, list[str]]) -> tuple[int, dict, bytes]:
        with self._lock:
            self.requests[method, path] += 1
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts == ["api", "agent-harnesses"]:  # huggingface_hub's user-agent registry, fetched once a day
            return _json({"standardEnvVars": [], "harnesses": {}})
        if len(parts) >= 3 and parts[:2] == ["api", "models"]:
            repo_id, rest = "/".join(parts[2:4]), parts[4:]
            if repo_id not in self.repos:
                return _error(404, "RepoNotFound", "Repository not found")
            if not rest or rest[0] == "revision":
                return self._info(repo_id, rest[1] if len(rest) > 1 else "main")
            if rest[0] == "tree" and len(rest) >= 2:
                return self._tree(repo_id, rest[1], "/".join(rest[2:]), query.get("recursive", ["false"])[0])
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo_id, rev, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            return self._resolve(method, repo_id, rev, filename)
        return _error(404, None, "Not found")

    def _info(self, repo_id: str, rev: str) -> tuple[int, dict, bytes]:
        found = self._revision(repo_id, rev)
        if found is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        sha, files = found
        return _json({"id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                      "siblings": [{"rfilename": p} for p in sorted(files)]})

    def _tree(self, repo_id: str, rev: str, under: str, recursive: str) -> tuple[int, dict, bytes]:
        found = self._revision(repo_id, rev)
        if found is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        _, files = found
        prefix = under.strip("/") + "/" if under.strip("/") else ""
        deep = recursive.lower() in ("true", "1")
        entries, folders = [], set()
        for p, data in sorted(files.items()):
            if not p.startswith(prefix):
                continue
            rel = p[len(prefix):].split("/")
            for i in range(1, len(rel) if deep else min(len(rel), 2)):
                folders.add(prefix + "/".join(rel[:i]))
            if deep or len(rel) == 1:
                entries.append({"type": "file", "path": p, "size": len(data), "oid": _git_oid(data)})
        if prefix and not entries and not folders:
            return _error(404, "EntryNotFound", f"{under} does not exist at {rev}")
        entries += [{"type": "directory", "path": f, "size": 0, "oid": hashlib.sha1(f.encode()).hexdigest()}
                    for f in sorted(folders)]
        return _json(entries)

    def _resolve(self, method: str, repo_id: str, rev: str, filename: str) -> tuple[int, dict, bytes]:
        if repo_id not in self.repos:
            return _error(404, "RepoNotFound", "Repository not found")
        found = self._revision(repo_id, rev)
        if found is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        sha, files = found
        if filename not in files:
            status, headers, body = _error(404, "EntryNotFound", f"{filename} does not exist at {rev}")
            return status, {**headers, "X-Repo-Commit": sha}, body
        data = files[filename]
        headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Content-Type": "application/octet-stream", "Content-Length": str(len(data))}
        return 200, headers, data if method == "GET" else b""


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _json(obj) -> tuple[int, dict, bytes]:
    body = json.dumps(obj).encode()
    return 200, {"Content-Type": "application/json", "Content-Length": str(len(body))}, body


def _error(status: int, code: str | None, message: str) -> tuple[int, dict, bytes]:
    body = json.dumps({"error": message}).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(body)), "X-Error-Message": message}
    if code is not None:
        headers["X-Error-Code"] = code
    return status, headers, body


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            status, headers, body = hub.respond(method, url.path, parse_qs(url.query))
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if method == "GET":
                self.wfile.write(body)

        def do_GET(self):  # noqa: N802 - http.server's naming
            self._serve("GET")

        def do_HEAD(self):  # noqa: N802
            self._serve("HEAD")

        def log_message(self, *args):  # keep pytest output clean
            pass

    return Handler
