"""The package's own command line: `python PACKAGE run --prompt TEXT`, `python PACKAGE chat`, `python PACKAGE bench`.

It runs where deploycc is not installed, so it uses argparse and the runtime alone (numpy, the
backend binding, tokenizers, jinja2, safetensors). The pieces that do the work — one-shot generation,
the chat REPL, the benchmark — take any session with the runtime contract (`prefill`, `decode`,
`reset`, `truncate`, `context_window`) and a tokenizer, so `deploycc run/chat/bench` reuse them for packages and
for the numpy reference alike. Bad input is one line `error: ...` on stderr and exit 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .bench import batch_bench, batch_bench_lines, bench, bench_lines, parse_counts
from .devices import DeviceError
from .errors import PackageError
from .generate import ContextWindowError, UsageError, encode_prompt, generate
from .grammar import Grammar, GrammarError
from .kvcache import ContextWindowFull
from .safetensors_io import SafetensorsError
from .sampler import LLAMA_CLI, SAMPLING_FIELDS, Sampler, SamplingDefaults, resolve_sampling
from .server import ServeError, ServeOptions, allowed_hosts
from .symexpr import SymExprError
from .tokenizer import TokenizerError, clean_text
from .vm import VMError

# Every error a user can cause or fix; anything else is a bug and keeps its traceback.
USER_ERRORS = (UsageError, PackageError, DeviceError, VMError, ContextWindowFull, ContextWindowError, TokenizerError,
               SafetensorsError, SymExprError, ServeError, GrammarError)

CHAT_HELP = """commands:
  /system TEXT   set the system prompt (no TEXT: remove it); the history is kept
  /reset         forget the conversation (the system prompt stays); a conversation that outgrows the
                 context window drops its oldest turns by itself, and says so
  /stats         prefill and decode speed of the last reply (prefill counts the new tokens only: the
                 earlier turns stay in the KV cache), and the sampler settings with where they come from
  /help          this list
  Ctrl-C         stop a reply; what was shown of it stays in the conversation (a reply stopped
                 before any text is dropped, with its message)
  /exit          leave (Ctrl-D too)"""


def sampling_options(max_tokens: int = 64, temperature: float | None = None, top_p: float | None = None,
                     top_k: int | None = None, repetition_penalty: float | None = None, seed: int = 0,
                     min_p: float | None = None) -> dict:
    """Checked generation options (a bad value is a UsageError before any model work). A sampling setting left
    None was not given: with_model_sampling fills it in once the model is loaded."""
    given = dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, repetition_penalty=repetition_penalty)
    try:
        Sampler(**{k: v for k, v in given.items() if v is not None}, seed=seed)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {max_tokens}")
    return dict(max_tokens=max_tokens, seed=seed, **given)


def grammar_option(json_schema: str | None = None, grammar: str | None = None) -> dict:
    """generate's `grammar` from --json-schema FILE (a JSON schema) or --grammar FILE (Lark or GBNF), checked
    before any model work; {} without either."""
    if json_schema and grammar:
        raise UsageError("give --json-schema or --grammar, not both")
    path = json_schema or grammar
    if not path:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if grammar:
        return {"grammar": Grammar.text(text, str(path))}
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{path} is not JSON: {e}; give a JSON schema") from None
    return {"grammar": Grammar.json_schema(schema, str(path))}


def with_model_sampling(options: dict, tokenizer, fallback: SamplingDefaults = LLAMA_CLI) -> dict:
    """generate's keyword arguments for run and chat: sampling_options' settings, those not given taken from
    the model's generation_config.json, else from `fallback` (runtime/sampler.py: resolve_sampling); `sampling`
    holds the resolution, for /stats and run --json."""
    sampling = resolve_sampling(options, tokenizer.generation_sampling, fallback)
    rest = {k: v for k, v in options.items() if k not in SAMPLING_FIELDS}
    return {**rest, **sampling.options(), "sampling": sampling}


def timings(stats: dict) -> dict:
    return {"prefill_seconds": round(stats.get("prefill_seconds", 0.0), 6),
            "decode_seconds": round(stats.get("decode_seconds", 0.0), 6),
            "prefill_tok_s": round(stats.get("prefill_tok_s", 0.0), 3),
            "decode_tok_s": round(stats.get("decode_tok_s", 0.0), 3)}


# ---- run ---------------------------------------------------------------------------------------

def run_prompt(session, tokenizer, prompt: str, *, chat: bool = True, as_json: bool = False, out=None, err=None,
               info: dict | None = None, sampling=None, **options) -> dict | None:
    """Generate one reply: stream it to `out` and a timings line to `err`, or print one JSON object (with
    the timings, and `sampling`'s settings as "sampler") with `as_json`. Returns the object; None when `out` was
    closed by its reader (`| head`), which ends the run quietly."""
    out, err = out or sys.stdout, err or sys.stderr
    prompt = clean_text(prompt)
    if chat and not tokenizer.chat_template:
        err.write(f"note: {NO_TEMPLATE}\n")
        err.flush()
    prompt_ids = encode_prompt(tokenizer, prompt, chat)
    if not prompt_ids:
        raise UsageError("the prompt encodes to no tokens; give some text")
    stats: dict = {}
    pieces = []
    t0 = time.perf_counter()
    try:
        for piece in generate(session, tokenizer, prompt, chat=chat, stats=stats, **options):
            pieces.append(piece)
            if not as_json:
                out.write(piece)
                out.flush()
        result = {**(info or {}), "prompt": prompt, "prompt_ids": [int(i) for i in prompt_ids],
                  "generated": [int(i) for i in stats.get("generated", [])], "text": "".join(pieces),
                  "finish_reason": stats.get("finish_reason"), "prompt_tokens": stats.get("prompt_tokens"),
                  **({"sampler": {**sampling.to_json(), "seed": options.get("seed", 0)}} if sampling else {}),
                  "timings": {**timings(stats), "total_seconds": round(time.perf_counter() - t0, 6)}}
        out.write(json.dumps(result) + "\n" if as_json else "\n")
        out.flush()
    except BrokenPipeError:
        quiet_stdout()
        return None
    if not as_json:
        err.write(stats_line(stats) + "\n")
        err.flush()
    return result


# ---- chat --------------------------------------------------------------------------------------

class Conversation:
    """Multi-turn history on one session. The chat template renders the whole list each turn, and the
    session's KV cache is kept across turns (generate's reuse_cache): a turn prefills only what its prompt adds
    to the tokens already cached, the previous reply included. When history and message leave no room
    for a reply, the oldest turns are dropped (`dropped` says how many, for the caller to tell the user);
    the system prompt stays. A turn that fails (a message over the context window, a template error)
    leaves the history as it was."""

    def __init__(self, session, tokenizer, system: str | None = None, **options):
        self.session, self.tokenizer, self.options = session, tokenizer, options
        self.system = system or None
        self.turns: list[dict] = []  # user, assistant, user, assistant, ...
        self.last: dict | None = None
        self.dropped = 0  # turns (user + assistant) the last reply() dropped to fit the context window

    @property
    def messages(self) -> list[dict]:
        return self._head() + self.turns

    def _head(self) -> list[dict]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def reply(self, text: str):
        """Stream the reply to `text`; the turn joins the history once the stream ends (or is cut short:
        the text shown so far is kept, and a reply stopped before any text is dropped with its message)."""
        stats: dict = {}
        user = {"role": "user", "content": clean_text(text)}
        drop = self._turns_to_drop(user)
        messages = self._head() + self.turns[drop:] + [user]
        stream = generate(self.session, self.tokenizer, messages, stats=stats, reuse_cache=True, **self.options)
        self.dropped = drop // 2
        return self._stream(stream, user, stats, drop)

    def _turns_to_drop(self, user: dict) -> int:
        """How many of the oldest messages to drop (whole turns) so that the prompt leaves room for a
        reply: max_tokens, up to a quarter of the window; at least one token if nothing else fits. When
        even the message alone does not fit, all (generate then refuses it, measuring the message alone)."""
        window = int(self.session.context_window)
        reserve = max(1, min(int(self.options.get("max_tokens", 64)), window // 4))
        lengths = []
        for drop in range(0, len(self.turns) + 1, 2):
            n = len(encode_prompt(self.tokenizer, self._head() + self.turns[drop:] + [user]))
            if n + reserve <= window:
                return drop
            lengths.append((drop, n))
        return next((drop for drop, n in lengths if n + 1 <= window), len(self.turns))

    def _stream(self, stream, user: dict, stats: dict, drop: int):
        pieces = []
        try:
            for piece in stream:
                pieces.append(piece)
                yield piece
        finally:
            stream.close()
            self.last = stats
            if stats.get("generated") and (pieces or stats.get("finish_reason") != "cancelled"):
                self.turns = self.turns[drop:] + [user, {"role": "assistant", "content": "".join(pieces)}]

    def reset(self) -> None:
        """Forget the turns (the KV cache keeps what the next prompt shares with it: the system prompt)."""
        self.turns = []


def stats_line(stats: dict | None) -> str:
    """`prefill N tokens at X tok/s, decode M tokens at Y tok/s (finish reason)`; N counts the tokens
    computed, without those reused from the KV cache."""
    if not stats:
        return "no reply yet"
    gen = len(stats.get("generated", []))
    prefilled = stats.get("prefilled_tokens", stats["prompt_tokens"])
    return (f"prefill {prefilled} tokens at {stats['prefill_tok_s']:.1f} tok/s, "
            f"decode {gen} tokens at {stats['decode_tok_s']:.1f} tok/s ({stats['finish_reason']})")


def chat_repl(session, tokenizer, *, name: str = "model", system: str | None = None, stdin=None, out=None, err=None,
              interactive: bool | None = None, errors: tuple = USER_ERRORS, sampling=None, **options) -> int:
    """Read-eval-print loop. With a terminal: a banner, a `>>> ` prompt and line editing; with piped
    input: the replies alone, one per line. Errors of one turn are reported and the session goes on.
    `sampling` (with_model_sampling) is what /stats names as the sampler."""
    require_chat_template(tokenizer, name)
    stdin, out, err = stdin or sys.stdin, out or sys.stdout, err or sys.stderr
    if hasattr(stdin, "reconfigure"):  # bytes that are not UTF-8 become U+FFFD (input() follows stdin's errors too)
        stdin.reconfigure(errors="replace")
    if interactive is None:
        interactive = stdin.isatty()
    conv = Conversation(session, tokenizer, system and clean_text(system), **options)
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:  # pragma: no cover - not on every platform
            pass
        out.write(f"chatting with {name} (context window {session.context_window} tokens); /help for commands\n")
    while True:
        try:
            if interactive:
                line = input(">>> ")
            else:
                line = stdin.readline()
                if not line:
                    break
        except EOFError:
            break
        except KeyboardInterrupt:
            out.write("\n")
            break
        line = clean_text(line).strip()
        if not line:
            continue
        if line.startswith("/"):
            cmd, _, arg = line.partition(" ")
            if cmd in ("/exit", "/quit"):
                break
            if cmd == "/reset":
                conv.reset()
                out.write("(conversation reset)\n")
            elif cmd == "/stats":
                out.write(stats_line(conv.last) + "\n")
                if sampling is not None:
                    out.write(f"sampler: {sampling.describe()}\n")
            elif cmd == "/system":
                conv.system = arg.strip() or None
                out.write("(system prompt set)\n" if conv.system else "(system prompt removed)\n")
            elif cmd == "/help":
                out.write(CHAT_HELP + "\n")
            else:
                err.write(f"error: unknown command {cmd}; /help lists the commands\n")
            out.flush()
            continue
        try:
            _chat_turn(conv, line, out, err, errors)
        except BrokenPipeError:  # the reader of the replies left: end quietly
            quiet_stdout()
            break
    return 0


NO_TEMPLATE = ("this model has no chat template: the prompt goes to it as plain text (compile with --chat-template "
               "FILE|NAME to give the package one)")


def require_chat_template(tokenizer, name: str) -> None:
    if not tokenizer.chat_template:
        raise TokenizerError(f"{name} has no chat template (tokenizer_config.json has no chat_template and there is no "
                             f"chat_template.jinja), so it cannot chat; compile it with --chat-template FILE|NAME, "
                             f"or use run --no-chat for plain text completion")


def _chat_turn(conv: Conversation, line: str, out, err, errors: tuple) -> None:
    """One message and its streamed reply; an error is one line on `err`, Ctrl-C stops the reply."""
    wrote = False
    stream = None
    try:
        stream = conv.reply(line)
        if conv.dropped:
            turns = "the oldest turn" if conv.dropped == 1 else f"the {conv.dropped} oldest turns"
            err.write(f"(dropped {turns} to fit the context window)\n")
            err.flush()
        for piece in stream:
            out.write(piece)
            out.flush()
            wrote = True
    except KeyboardInterrupt:
        out.write(" (interrupted)")
    except errors as e:
        out.write("\n" if wrote else "")
        out.flush()
        err.write(f"error: {e}\n")
        err.flush()
        return
    finally:
        if stream is not None:
            stream.close()  # now, not when garbage collected: the history and the cache follow what was shown
    out.write("\n")
    if conv.last and conv.last.get("finish_reason") == "context":
        out.write("(the reply filled the context window; the next turn drops the oldest turns)\n")
    out.flush()


# ---- the package's entry point ---------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse with bad usage as one `error:` line (exit 2, the usage convention) instead of usage text."""

    def error(self, message: str):
        self.exit(2, f"error: {message.rstrip('.')}; see '{self.prog} --help'\n")


def _parser(package_dir: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"python {package_dir}",
                                description="Run this deploycc package (no deploycc installation needed).")
    sub = p.add_subparsers(dest="command", required=True, metavar="{run,chat,bench,serve,verify}")

    def generation(sp, max_tokens: int):
        sp.add_argument("--max-tokens", type=int, default=max_tokens, help=f"(default {max_tokens})")
        sp.add_argument("--temperature", type=float, default=None,
                        help="0 is greedy (default: the model's generation_config.json, else llama.cpp's 0.8; the "
                             "same for the options below)")
        sp.add_argument("--top-p", type=float, default=None, help="1 means off (default 0.95)")
        sp.add_argument("--top-k", type=int, default=None, help="0 means off (default 40)")
        sp.add_argument("--min-p", type=float, default=None, help="0 means off (default 0.05)")
        sp.add_argument("--repetition-penalty", type=float, default=None, help="1 means off (default 1.0)")
        sp.add_argument("--seed", type=int, default=0, help="(default 0)")
        sp.add_argument("--json-schema", default=None, metavar="FILE",
                        help="reply with a JSON document of this schema (structured output; needs llguidance)")
        sp.add_argument("--grammar", default=None, metavar="FILE",
                        help="reply in this grammar (Lark, or llama.cpp's GBNF; needs llguidance)")

    run = sub.add_parser("run", help="one prompt, streamed to stdout")
    run.add_argument("--prompt", required=True,
                     help="the user message (the chat template is applied; a model without one gets the text as it "
                          "is, and run says so)")
    generation(run, 64)
    run.add_argument("--no-chat", action="store_true", help="feed the prompt as raw text, without the chat template")
    run.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    chat = sub.add_parser("chat", help="interactive chat (reads stdin when it is not a terminal)")
    generation(chat, 256)
    chat.add_argument("--system", default=None, help="system prompt")
    b = sub.add_parser("bench", help="prefill / decode tokens per second and memory")
    b.add_argument("--prompt-len", type=int, default=128, help="(default 128)")
    b.add_argument("--gen-len", type=int, default=128, help="(default 128)")
    b.add_argument("--repeat", type=int, default=3, help="(default 3)")
    b.add_argument("--seed", type=int, default=0, help="(default 0)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--sequences", type=_counts, default=None,
                   help="batched decode of this many sequences at once, e.g. 1,4,8 (the server's capacity)")
    v = sub.add_parser("verify", help="every kernel against its loop-level program, on this package's device")
    v.add_argument("--kernels", action="store_true", required=True,
                   help="run each kernel on random inputs at the corners of its size bounds and compare it with the "
                        "loop-level program it was compiled from (runtime/kernel_check.py)")
    v.add_argument("--seed", type=int, default=0, help="(default 0)")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs starlette and uvicorn)")
    s.add_argument("--host", default="127.0.0.1", help="(default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="(default 8000)")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 calls")
    s.add_argument("--max-queue", type=int, default=16, help="requests that may wait; beyond, 429 (default 16)")
    s.add_argument("--max-num-sequences", type=int, default=None,
                   help="requests batched at once (default: the package's max_num_sequences)")
    s.add_argument("--model-name", default=None, help="the model id clients name (default: the package's name)")
    s.add_argument("--allowed-hosts", default=None,
                   help="Host headers to answer, comma-separated HOST or HOST:PORT, or '*' for any (default: the "
                        "bound address and localhost names; IP addresses always)")
    s.add_argument("--max-body-bytes", type=int, default=ServeOptions.max_body_bytes,
                   help=f"largest request body; beyond, 413 (default {ServeOptions.max_body_bytes})")
    s.add_argument("--shutdown-timeout", type=float, default=ServeOptions.shutdown_timeout,
                   help=f"seconds the requests in flight get after SIGTERM or Ctrl-C; a second signal exits at "
                        f"once (default {ServeOptions.shutdown_timeout:g})")
    for sp in (run, chat, b, v, s):  # runtime/trust.py: with a key, only a package it signed loads
        sp.add_argument("--trust", action="append", default=[], metavar="KEY.pub",
                        help="run only if signed by this public key (repeatable; also $DEPLOYCC_TRUSTED_KEYS, a "
                             "path list)")
    return p


def _counts(text: str) -> list[int]:
    try:
        return parse_counts(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--sequences ")) from None


def _gen_options(args) -> dict:
    return {**sampling_options(args.max_tokens, args.temperature, args.top_p, args.top_k, args.repetition_penalty,
                               args.seed, args.min_p), **grammar_option(args.json_schema, args.grammar)}


def _command(package_dir: str, args) -> int:
    from .batch import session_of
    from .engine import Engine
    from .trust import ENV, make_policy

    trust = make_policy(args.trust, os.environ.get(ENV))  # every key read (and cryptography found) before any work

    if args.command == "run":
        options = _gen_options(args)
        engine = Engine.load(package_dir, trust=trust, paged="auto")
        run_prompt(session_of(engine), engine.tokenizer, args.prompt, chat=not args.no_chat, as_json=args.json,
                   info={"package": str(package_dir), **engine.variants},
                   **with_model_sampling(options, engine.tokenizer))
    elif args.command == "chat":
        options = _gen_options(args)
        engine = Engine.load(package_dir, trust=trust, paged="auto")
        return chat_repl(session_of(engine), engine.tokenizer, name=Path(package_dir).name, system=args.system,
                         **with_model_sampling(options, engine.tokenizer))
    elif args.command == "serve":
        from .server import serve

        options = ServeOptions(args.host, args.port, args.api_key, args.max_queue, args.max_num_sequences,
                               args.shutdown_timeout, args.max_body_bytes, allowed_hosts(args.allowed_hosts))
        engine = Engine.load(package_dir, trust=trust, paged=True)
        serve(engine, args.model_name or Path(package_dir).resolve().name, options)
    elif args.sequences:
        engine = Engine.load(package_dir, trust=trust, paged=True)
        r = batch_bench(engine, args.sequences, args.prompt_len, args.gen_len, args.seed)
        print(json.dumps(r) if args.json else "\n".join(batch_bench_lines(r)))
    else:
        engine = Engine.load(package_dir, trust=trust)
        r = bench(engine, args.prompt_len, args.gen_len, args.repeat, args.seed)
        print(json.dumps(r) if args.json else "\n".join(bench_lines(r)))
    return 0


def _verify(package_dir: str, args) -> int:
    from .kernel_check import verify_command
    from .trust import ENV, make_policy

    trust = make_policy(args.trust, os.environ.get(ENV))
    report = verify_command(package_dir, args.json, args.seed, trust=trust)
    if not report.passed:
        print(f"error: {report.failure}", file=sys.stderr)
    return 0 if report.passed else 1


def main(package_dir: str, argv: list[str] | None = None) -> None:
    args = _parser(package_dir).parse_args(argv)
    try:
        code = _verify(package_dir, args) if args.command == "verify" else _command(package_dir, args)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:  # `python PKG run ... | head`: the reader left; not an error
        quiet_stdout()
        sys.exit(0)
    sys.exit(code)


def quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so that the flush at exit does not complain again."""
    import os

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's StringIO): nothing to quiet
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
