"""A fuzz worker: a Python script in a subprocess that answers one JSON line per request line, so that a
native crash or a hang in the code under test is a counted outcome, not a dead pytest."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path


class Worker:
    """`ask(line, timeout)` -> the worker's JSON answer, {"kind": "hang"} past `timeout` seconds (the worker is
    killed and restarted on the next request), or {"kind": "crash", "code": exit status} if it died."""

    def __init__(self, script: Path, *args: str):
        self.script = script
        self.args = args
        self.proc = None

    def ask(self, line: str, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
            self.proc = subprocess.Popen([sys.executable, str(self.script), *self.args], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                         env=env)
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.stop()
            return {"kind": "hang"}
        answer = self.proc.stdout.readline()
        if not answer:
            code, self.proc = self.proc.wait(), None
            return {"kind": "crash", "code": code}
        return json.loads(answer)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
