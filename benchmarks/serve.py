"""Aggregate generation throughput of `deploycc serve` against llama-cpp-python's OpenAI server, on
SmolLM2-135M-Instruct, at 1, 4, 8 and 16 concurrent clients.

    .venv/bin/python benchmarks/serve.py [--clients 1,4,8,16] [--requests 4] [--max-tokens 64] [--threads 2] [--json]

Each server runs in its own process on 127.0.0.1 (deploycc: a `cpu` package as `deploycc compile` makes it by
default, q4f16_2; llama.cpp: `python -m llama_cpp.server` on the Q4_1 GGUF, in the llama-cpp-python
venv of benchmarks/compare.py, with its server extras installed there when missing). Every client sends
`--requests` chat completions (greedy, `--max-tokens` tokens at most, prompts from a fixed list) one after
another with the official openai client; aggregate tok/s is the completion tokens of all requests (as each
server's `usage` counts them) over the wall time from the first request to the last answer; "x 1 client" is
that over the same server's figure with one client (deploycc batches concurrent requests into one step of
the model; llama-cpp-python's server runs one request at a time).
"""
from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (  # noqa: E402
    ensure_llama_venv,
    ensure_model,
    ensure_package,
    load_fetch_script,
    log,
    machine_info,
    worker_env,
)

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three primary colors.",
           "Explain what a CPU cache is in one paragraph.", "Give me a short recipe for pancakes.",
           "Why is the sky blue?", "Name four planets of the solar system.", "What does HTTP stand for?"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int, proc: subprocess.Popen, log_file: Path, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"error: the server exited: {log_file.read_text()[-1000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise SystemExit("error: the server did not come up")


def load(port: int, model: str, clients: int, requests: int, max_tokens: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    tokens, latencies, errors, lock = [], [], [], threading.Lock()

    def one_client(i: int) -> None:
        for r in range(requests):
            prompt = PROMPTS[(i * requests + r) % len(PROMPTS)]
            t0 = time.perf_counter()
            try:
                out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                     max_tokens=max_tokens, temperature=0)
            except Exception as e:  # noqa: BLE001 - counted and shown
                with lock:
                    errors.append(repr(e)[:200])
                continue
            with lock:
                tokens.append(out.usage.completion_tokens)
                latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one_client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    latencies.sort()
    return {"clients": clients, "requests": len(tokens), "errors": errors, "tokens": sum(tokens),
            "seconds": wall, "tok_s": sum(tokens) / wall if wall else 0.0,
            "p50_latency_s": latencies[len(latencies) // 2] if latencies else None}


def run_server(cmd: list[str], port: int, log_file: Path, env: dict | None = None) -> subprocess.Popen:
    """The server's output goes to `log_file` (a pipe nobody reads would fill and stop it)."""
    with open(log_file, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
    wait_ready(port, proc, log_file)
    return proc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8, 16])
    ap.add_argument("--requests", type=int, default=4, help="requests per client (default 4)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    fetch = load_fetch_script()
    bench = fetch.cache_home() / "bench"
    hf_dir, gguf = ensure_model(fetch)
    pkg = ensure_package(bench, "q4f16_2", hf_dir, ["--quantization", "q4f16_2"], args.threads)  # the cpu default
    llama_py = ensure_llama_venv(bench)
    if subprocess.run([str(llama_py), "-c", "import uvicorn, fastapi, sse_starlette, starlette_context, pydantic_settings"],
                      capture_output=True).returncode:
        log("llama.cpp: installing llama-cpp-python's server extras")
        subprocess.run([str(llama_py), "-m", "pip", "install", "-q", "uvicorn", "fastapi", "sse-starlette",
                        "starlette-context", "pydantic-settings"], check=True)
    servers = {
        "deploycc": lambda port: run_server([sys.executable, "-m", "deploycc", "serve", str(pkg), "--port", str(port),
                                             "--max-queue", "64", "--model-name", "smollm2"], port,
                                            bench / "serve-deploycc.log", worker_env(args.threads)),
        "llama.cpp": lambda port: run_server([str(llama_py), "-m", "llama_cpp.server", "--model", str(gguf),
                                              "--model_alias", "smollm2", "--n_ctx", "4096", "--n_threads",
                                              str(args.threads), "--n_threads_batch", str(args.threads), "--port",
                                              str(port)], port, bench / "serve-llama.log",
                                             worker_env(args.threads, llama=True)),
    }
    rows = []
    for tool, start in servers.items():
        port = free_port()
        log(f"{tool}: starting")
        proc = start(port)
        try:
            load(port, "smollm2", 1, 1, 8)  # warm-up
            for c in args.clients:
                log(f"{tool}: {c} clients")
                rows.append({"tool": tool, **load(port, "smollm2", c, args.requests, args.max_tokens)})
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    result = {"rows": rows, "machine": machine_info(), "threads": args.threads, "requests_per_client": args.requests,
              "max_tokens": args.max_tokens}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['machine'].get('cpu', '')}, {args.threads} threads; SmolLM2-135M-Instruct; "
          f"{args.requests} requests per client, up to {args.max_tokens} tokens each")
    print(f"{'server':10} {'clients':>7} {'requests':>8} {'errors':>6} {'tokens':>7} {'seconds':>8} {'tok/s':>8} "
          f"{'x 1 client':>10} {'p50 latency s':>13}")
    single = {r["tool"]: r["tok_s"] for r in rows if r["clients"] == 1}
    for r in rows:
        ratio = f"{r['tok_s'] / single[r['tool']]:.2f}" if single.get(r["tool"]) else "-"
        print(f"{r['tool']:10} {r['clients']:7d} {r['requests']:8d} {len(r['errors']):6d} {r['tokens']:7d} "
              f"{r['seconds']:8.2f} {r['tok_s']:8.1f} {ratio:>10} {r['p50_latency_s'] or 0:13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
