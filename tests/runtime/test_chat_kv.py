"""Chat as users expect it, on a real tiny package (cpu-opencl) and on the numpy reference: the KV cache is
kept across turns (only the new part of a prompt is prefilled) and replies equal a fresh session's with the
same history; an interrupted reply keeps what was shown and leaves the cache consistent with it; a full
context window drops the oldest turns; `run` reports its speed on stderr; a closed stdout ends quietly.
"""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_device
from test_package_cli import with_tokenizer

import deploycc
from deploycc.errors import DeployError
from deploycc.runtime.cli import Conversation, chat_repl
from deploycc.runtime.generate import encode_prompt, generate
from deploycc.runtime.tokenizer import Tokenizer
from fixtures import make_tiny

STATS = re.compile(r"^prefill (\d+) tokens at [\d.]+ tok/s, decode (\d+) tokens at [\d.]+ tok/s \((\w+)\)$")
TURNS = ["hi", "The capital of France?", "Hello, world!"]  # three turns fit the window of 128 with 6-token replies


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return with_tokenizer(make_tiny("llama-gqa1"), tmp_path_factory.mktemp("chat-kv") / "model")


@pytest.fixture(scope="module")
def package(model, tmp_path_factory) -> Path:
    require_device("opencl")
    from deploycc.package import compile_model

    return compile_model(str(model), "cpu-opencl", out=str(tmp_path_factory.mktemp("chat-kv-pkg") / "pkg"))


@pytest.fixture(scope="module")
def tok(model) -> Tokenizer:
    return Tokenizer.from_dir(model)


@pytest.fixture(scope="module", params=["cpu-opencl", "reference"])
def session(request, model):
    if request.param == "reference":
        return deploycc.reference_session(str(model))
    from deploycc.runtime.engine import Engine

    return Engine.load(request.getfixturevalue("package"))


def fresh(session, tok, messages, max_tokens) -> tuple[str, dict]:
    """The reply of a session reset first (nothing reused), greedy."""
    stats: dict = {}
    text = "".join(generate(session, tok, messages, max_tokens=max_tokens, stats=stats))
    return text, stats


def common_prefix(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_truncate_then_prefill_equals_a_full_prefill(session, tok):
    ids = encode_prompt(tok, [{"role": "user", "content": TURNS[1]}])
    session.reset()
    full = session.prefill(ids)
    session.reset()
    session.prefill(ids[:20] + [5, 6, 7])  # a prompt that shares 20 tokens, then differs
    session.truncate(20)
    np.testing.assert_allclose(session.prefill(ids[20:]), full, atol=1e-4, rtol=0)
    with pytest.raises((ValueError, DeployError), match="cannot keep"):
        session.truncate(len(ids) + 1)


def test_later_turns_prefill_only_their_new_tokens(session, tok):
    conv = Conversation(session, tok, max_tokens=6)
    cached = []  # what the KV cache holds after each turn: its prompt and the generated tokens fed back
    for i, text in enumerate(TURNS):
        reply = "".join(conv.reply(text))
        s = conv.last
        assert conv.dropped == 0
        history = conv.messages[:-1]  # the prompt of this turn: everything before the reply
        prompt = encode_prompt(tok, history)
        assert s["prompt_tokens"] == len(prompt)
        if i == 0:
            assert s["prefilled_tokens"] == s["prompt_tokens"]
        else:
            kept = min(common_prefix(cached, prompt), len(prompt) - 1)
            assert s["prefilled_tokens"] == len(prompt) - kept
            assert kept > len(cached) // 2, "the earlier turns were prefilled again"
        cached = prompt + s["generated"][:-1]  # the last sampled token is never fed back
        want, w = fresh(session, tok, history, 6)
        assert reply == want and s["generated"] == w["generated"], (i, reply, want)


def test_interrupted_reply_keeps_what_was_shown(session, tok):
    conv = Conversation(session, tok, max_tokens=10)
    "".join(conv.reply(TURNS[0]))
    shown = []
    with pytest.raises(KeyboardInterrupt):
        for piece in conv.reply(TURNS[1]):
            shown.append(piece)
            if len(shown) == 2:
                raise KeyboardInterrupt  # Ctrl-C while the reply streams
    assert conv.turns[-1] == {"role": "assistant", "content": "".join(shown)} and len(conv.turns) == 4
    assert conv.last["finish_reason"] == "cancelled"
    reply = "".join(conv.reply(TURNS[2]))
    assert conv.last["prefilled_tokens"] < conv.last["prompt_tokens"] // 2
    want, _ = fresh(session, tok, conv.messages[:-1], 10)
    assert reply == want


class CtrlCInDecode:
    """A real session that gets Ctrl-C during its `after`-th decode, once the device has done the step:
    its KV cache has grown by a token the generation loop never saw come back."""

    def __init__(self, session, after: int):
        self.session, self.after, self.calls = session, after, 0

    def __getattr__(self, name):
        return getattr(self.session, name)

    def decode(self, token):
        self.calls += 1
        logits = self.session.decode(token)
        if self.calls == self.after:
            raise KeyboardInterrupt
        return logits


def test_interrupt_inside_a_session_call(session, tok):
    wrapped = CtrlCInDecode(session, after=3)
    conv = Conversation(wrapped, tok, max_tokens=10)
    with pytest.raises(KeyboardInterrupt):
        for _ in conv.reply(TURNS[1]):
            pass
    assert conv.turns and conv.turns[-1]["role"] == "assistant"
    reply = "".join(conv.reply(TURNS[2]))
    assert conv.last["prefilled_tokens"] == conv.last["prompt_tokens"], "an unknown cache must be prefilled anew"
    assert reply == fresh(session, tok, conv.messages[:-1], 10)[0]


def test_full_context_drops_the_oldest_turns(session, tok):
    lines = [f"the capital of France {i}" for i in range(8)]  # ~25 tokens a turn: the window holds about 4
    out, err = io.StringIO(), io.StringIO()
    chat_repl(session, tok, system="Be brief.", stdin=io.StringIO("".join(x + "\n" for x in lines)), out=out, err=err,
              interactive=False, max_tokens=12)
    notes = err.getvalue().splitlines()
    assert notes and all(re.fullmatch(r"\(dropped (the oldest turn|the \d+ oldest turns) to fit the context window\)", n)
                         for n in notes), notes
    replies = out.getvalue().splitlines()
    assert len(replies) == len(lines)
    # the same conversation step by step: the turn after a drop equals a fresh session given what was kept
    conv = Conversation(session, tok, system="Be brief.", max_tokens=12)
    drops = 0
    for i, line in enumerate(lines):
        reply = "".join(conv.reply(line))
        assert reply == replies[i]
        assert conv.messages[0] == {"role": "system", "content": "Be brief."}
        if conv.dropped:
            drops += 1
            assert conv.last["prompt_tokens"] + 12 <= session.context_window
            assert reply == fresh(session, tok, conv.messages[:-1], 12)[0]
    assert drops == len(notes) and len(conv.turns) < 2 * len(lines)


# ---- the command line: timings on stderr, a closed stdout ----------------------------------------------------

def test_run_prints_timings_to_stderr(package):
    r = subprocess.run([sys.executable, "-m", "deploycc", "run", package, "--prompt", "hi", "--max-tokens", "5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    m = STATS.match(r.stderr.strip())
    assert m and int(m[1]) > 5 and 1 <= int(m[2]) <= 5, r.stderr
    j = subprocess.run([sys.executable, "-m", "deploycc", "run", package, "--prompt", "hi", "--max-tokens", "5", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert j.returncode == 0 and j.stderr == "" and json.loads(j.stdout)["timings"]["prefill_tok_s"] > 0


COMMANDS = {"deploycc run": [sys.executable, "-m", "deploycc", "run", "{pkg}", "--prompt", "hi", "--max-tokens", "40"],
            "package run": [sys.executable, "{pkg}", "run", "--prompt", "hi", "--max-tokens", "40"],
            "deploycc chat": [sys.executable, "-m", "deploycc", "chat", "{pkg}", "--max-tokens", "10"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_closed_stdout_ends_quietly(package, command):
    """The reader is gone before the first word (`... | true`): exit 0, nothing on stderr."""
    argv = [a.format(pkg=package) for a in COMMANDS[command]]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    _, err = p.communicate(b"hi\nhi\n", timeout=120)
    assert p.returncode == 0 and err == b"", err.decode()


@pytest.mark.parametrize("command", ["deploycc run", "package run"])
def test_pipe_into_head(package, command):
    """`... | head -c 1` under pipefail: the reader leaves after one byte; the command still exits 0."""
    argv = " ".join(f"'{a.format(pkg=package)}'" for a in COMMANDS[command])
    r = subprocess.run(["bash", "-c", f"set -o pipefail; {argv} | head -c 1"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and len(r.stdout) == 1, r.stderr
    assert "Traceback" not in r.stderr and "error" not in r.stderr, r.stderr
