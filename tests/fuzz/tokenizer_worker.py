"""A long-lived worker for tests/fuzz/test_fuzz_tokenizer.py: reads one JSON case per line on stdin and answers
with one JSON line. A case is {"files": DIR, "vocab_size": N} (load the tokenizer directory, encode, decode,
stream-decode, render the chat template) or {"template": TEXT, "limits": {...}} (render a chat template
under those limits and encode the result). The answer: {"kind": "ok"} | {"kind": "error", "type", "message"}
(a TokenizerError, the one error these may raise) | {"kind": "other", "type", "message"} (any other
exception: a bug), with the seconds the case took and the process's peak RSS during the case. The tokenizers library is
native code: a crash ends this process, and the parent sees EOF and the signal.
"""
from __future__ import annotations

import json
import sys
import time
import traceback

from deploycc.runtime.chat_template import TemplateLimits
from deploycc.runtime.procstat import peak_rss_bytes
from deploycc.runtime.tokenizer import Tokenizer, TokenizerError

TEXT = "Hello, world! Crème brûlée 🙂 <|im_end|> 12345\n\tend"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi 🙂"},
            {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "x" * 50}]
_BACKEND = None  # the template cases' tokenizer backend, loaded once


def files_case(case: dict) -> None:
    tok = Tokenizer.from_dir(case["files"], vocab_size=case["vocab_size"])
    ids = tok.encode(TEXT)
    tok.decode(ids)
    stream = tok.stream_decoder()
    "".join(stream.put(i) for i in ids) + stream.flush()
    if tok.chat_template:
        tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)


def template_case(case: dict) -> dict:
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = Tokenizer.from_dir(case["tokenizer"]).backend
    limits = TemplateLimits(**case["limits"])
    tok = Tokenizer(_BACKEND, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, case["template"], limits=limits)
    text = tok.apply_chat_template(MESSAGES)
    assert len(text) <= limits.max_output, f"rendered {len(text)} characters, over the limit of {limits.max_output}"
    tok.encode(text, add_special_tokens=False)
    return {"chars": len(text)}


def reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM, so that the peak reported is this case's own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def run(case: dict) -> dict:
    reset_peak_rss()
    t0 = time.perf_counter()
    try:
        extra = template_case(case) if "template" in case else files_case(case) or {}
        out = {"kind": "ok", **extra}
    except TokenizerError as e:
        out = {"kind": "error", "type": type(e).__name__, "message": str(e)[:300]}
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the test (PanicException too)
        if isinstance(e, KeyboardInterrupt):
            raise
        tail = traceback.format_exc().strip().splitlines()[-3:]
        out = {"kind": "other", "type": type(e).__name__, "message": " | ".join(tail)[:600]}
    return {**out, "seconds": time.perf_counter() - t0, "peak_rss": peak_rss_bytes()}


def main() -> None:
    for line in sys.stdin:
        print(json.dumps(run(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
