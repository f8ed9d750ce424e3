"""Catalogue: Ctrl-C in `python PKG chat`, driven as a person would, in a pseudo-terminal (pexpect).

A long paste (about 3,000 tokens: seconds of prefill on the tiny llama with a 4096-token context), Ctrl-C while
it is prefilled, then the next turn. It used to die on that next turn (`a step holds 1..16 sequences and 1..512
tokens, got 1 and -1499`: the batcher went on with the abandoned prefill while the session forgot it, exit 1,
the conversation lost). Now the REPL goes on; the chunks that were prefilled before the interrupt stay in the KV
cache, so the next turn with the same text prefills only the rest; and its reply is the reply of a fresh run of
that text (greedy, the same chunk boundaries: equal ids), so what was kept is what a fresh prefill computes.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import require_cc, require_module
from test_package_cli import STATS
from tiny_package import compile_long_tiny_package

pexpect = require_module("pexpect")

PASTE = " ".join(["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.",
                  "Hello, world! Be brief."] * 50)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    require_cc()
    return compile_long_tiny_package(tmp_path_factory.mktemp("chat-interrupt"))


def stats(child) -> tuple[int, int, str]:
    """(prefilled tokens, decoded tokens, finish reason) of the last reply, from /stats."""
    child.sendline("/stats")
    child.expect(r"prefill \d+ tokens at [\d.]+ tok/s, decode \d+ tokens at [\d.]+ tok/s \(\w+\)")
    m = STATS.match(child.after)
    child.expect(">>> ")
    return int(m.group(1)), int(m.group(2)), m.group(3)


def fresh_run(package, text: str) -> dict:
    r = subprocess.run([sys.executable, str(package), "run", "--prompt", text, "--max-tokens", "8", "--temperature", "0",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_ctrl_c_during_a_long_prefill_then_the_next_turn(package):
    # A terminal wide enough that readline echoes the paste on one line (no wrapping in the text to match).
    child = pexpect.spawn(sys.executable, [str(package), "chat", "--max-tokens", "8", "--temperature", "0"],
                          encoding="utf-8", timeout=120, dimensions=(50, 20000))
    child.expect(">>> ")
    # The interrupt must land after some chunks were prefilled and before the first token: its delay after Enter
    # depends on this machine's speed, so try a few until one does (every try checks that the REPL goes on). Each
    # try pastes another text (a number before it), so that none reuses what an earlier one cached.
    landed = []
    for i, delay in enumerate((0.3, 0.6, 0.15, 1.0, 2.0, 0.08, 0.04, 0.02)):
        text, end = f"{i} {PASTE}", f"(try {i})"
        text += f" {end}"
        child.sendline(text)
        child.expect_exact(end)  # the echo of the line: the REPL has it
        got = child.expect([r"\(interrupted\)", ">>> ", pexpect.TIMEOUT], timeout=delay)
        if got == 0:
            raise AssertionError("interrupted before Ctrl-C was sent")
        if got == 1:  # the whole turn was over before the delay (a fast machine; Ctrl-C at the prompt would end the
            child.sendline("/reset")  # chat): a shorter delay, after a reset
            child.expect(">>> ")
            continue
        child.sendintr()
        child.expect(r"\(interrupted\)")
        child.expect(">>> ")
        prefilled, decoded, reason = stats(child)
        assert reason == "cancelled"
        if decoded:  # past the prefill already (the reply stays in the conversation): another try, with a reset
            child.sendline("/reset")
            child.expect(">>> ")
            continue
        # The next turn: the same text again (the interrupted message was dropped with its empty reply), answered
        # as a fresh run answers it, prefilling only what the interrupted prefill did not cache.
        child.sendline(text)
        child.expect_exact(end)
        child.expect(">>> ")
        reply = child.before.replace("\r\n", "\n").strip()
        prefilled, decoded, reason = stats(child)
        fresh = fresh_run(package, text)
        assert 2000 < fresh["prompt_tokens"] < 4000, fresh["prompt_tokens"]  # several chunks, within the window
        assert reason in ("length", "eos") and decoded == len(fresh["generated"])
        assert reply == fresh["text"].strip(), (reply, fresh["text"])
        landed.append((delay, prefilled, fresh["prompt_tokens"]))
        if prefilled < fresh["prompt_tokens"]:  # some chunks were kept from the interrupted prefill
            break
        child.sendline("/reset")
        child.expect(">>> ")
    assert landed and landed[-1][1] < landed[-1][2], landed
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "Traceback" not in (child.before or "")
