"""Tool calls (OpenAI's `tools` and `tool_choice`): the tools go to the chat template, and the reply is read back into
`tool_calls` in the format the template asks the model to write. The format is told from the template itself:

    hermes   `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one or more (Qwen2.5, Qwen3, Hermes)
    llama3   `{"name": ..., "parameters": {...}}` as the whole reply (Llama 3.1, 3.2, 3.3 with JSON tools)
    mistral  `[TOOL_CALLS][{"name": ..., "arguments": {...}}]` or `[TOOL_CALLS]name[ARGS]{...}` (Mistral, Devstral)

A template in none of these has no tool format deploycc reads: a request with tools is refused in one line rather
than guessed at. `tool_choice` "required" or a named function is enforced with a grammar (runtime/grammar.py) that
admits only calls, to the named function or to any of the tools, with arguments valid under each tool's parameters
schema; "auto" leaves the model free and reads whatever calls it wrote; "none" gives the template no tools.

The reader takes the reply as it streams, in pieces of any size (text that may be the start of a call is held back),
so the tool calls and content streamed are those of the whole reply. A call that does not parse, or names a function
that is not among the tools, stays in the content as the model wrote it.
"""
from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass

from .grammar import JSON_LAYOUT, Grammar, GrammarError
from .reasoning import tag_prefix as _partial

FORMATS = ("hermes", "llama3", "mistral")
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_MARK = "[TOOL_CALLS]"
MISTRAL_MARKERS = (MISTRAL_MARK, "[ARGS]", "[CALL_ID]")  # special tokens whose text a Mistral reply must keep
_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)(?:\[CALL_ID\]([A-Za-z0-9]+))?\[ARGS\]")


class ToolError(ValueError):
    """A tools request this template or server cannot serve (one line)."""


def template_format(template: str | None) -> str | None:
    """The tool-call format the chat template asks for, or None (the template has no tools, or an unknown kind)."""
    if not template:
        return None
    if HERMES_OPEN in template and HERMES_CLOSE in template:
        return "hermes"
    if MISTRAL_MARK in template:
        return "mistral"
    if '"parameters": ' in template and "<|start_header_id|>" in template:
        return "llama3"
    return None


def call_id(fmt: str) -> str:
    """A fresh id: OpenAI's `call_...`, or the 9 letters and digits Mistral's templates insist on."""
    if fmt == "mistral":
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str  # a JSON object, as OpenAI sends it

    def body(self, index: int | None = None) -> dict:
        """OpenAI's tool call object; with `index`, as a streamed delta carries it."""
        return {**({} if index is None else {"index": index}), "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolUse:
    """A request's tools as the server runs them: the template's format, the tools (OpenAI's objects), the choice
    ("auto", "required", or the name of the one function to call) and whether several calls may come at once."""
    fmt: str
    tools: tuple
    choice: str
    parallel: bool = True

    @property
    def names(self) -> frozenset:
        return frozenset(t["function"]["name"] for t in self.tools)

    def reader(self) -> ToolCallReader:
        return ToolCallReader(self.fmt, self.names)

    def grammar(self, tokenizer) -> Grammar | None:
        """The grammar that forces calls ("required", or one named function); None for "auto"."""
        if self.choice == "auto":
            return None
        tools = [t for t in self.tools if self.choice == "required" or t["function"]["name"] == self.choice]
        many = self.parallel and self.choice == "required" and self.fmt != "llama3"
        return calls_grammar(self.fmt, tools, tokenizer, many)


def _parameters(tool: dict) -> dict:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def _object(properties: dict, required: list) -> dict:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _json(schema: dict) -> str:
    """`%json` of a schema in llguidance's Lark, in the one layout structured output uses (runtime/grammar.py)."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def _mark(tokenizer, text: str) -> str:
    """A marker in the grammar: its token when the vocabulary has it as one (Qwen's <tool_call>), else its text."""
    i = tokenizer.token_to_id(text)
    return f"<[{i}]>" if i is not None else json.dumps(text)


def calls_grammar(fmt: str, tools: list, tokenizer, many: bool) -> Grammar:
    """A Lark grammar of one call (or, with `many`, one or more) to one of `tools`, in `fmt`."""
    one_of = [_object({"name": {"const": t["function"]["name"]},
                       ("parameters" if fmt == "llama3" else "arguments"): _parameters(t)},
                      ["name", "parameters" if fmt == "llama3" else "arguments"]) for t in tools]
    body = {"anyOf": one_of} if len(one_of) > 1 else one_of[0]
    if fmt == "hermes":
        call = f'{_mark(tokenizer, HERMES_OPEN)} "\\n" body "\\n" {_mark(tokenizer, HERMES_CLOSE)}'
        more = ' ("\\n" call)*' if many else ""  # Qwen's template writes calls one per line
        rules = [f"start: call{more}", f"call: {call}", f"body: {_json(body)}"]
    elif fmt == "llama3":
        rules = ["start: body", f"body: {_json(body)}"]
    else:
        mark = _mark(tokenizer, MISTRAL_MARK)
        if "[ARGS]" in (tokenizer.chat_template or ""):  # name[ARGS]{...} after each marker (v11 templates)
            args = _mark(tokenizer, "[ARGS]")
            alts = [f"{mark} {json.dumps(t['function']['name'])} {args} p{k}" for k, t in enumerate(tools)]
            rules = [f"start: call{'+' if many else ''}", "call: " + " | ".join(alts)]
            rules += [f"p{k}: {_json(_parameters(t))}" for k, t in enumerate(tools)]
        else:  # one marker, then a JSON list of calls
            listed = {"type": "array", "items": body, "minItems": 1, **({} if many else {"maxItems": 1})}
            rules = [f"start: {mark} body", f"body: {_json(listed)}"]
    try:
        return Grammar.text("\n".join(rules) + "\n", "the tools' parameters")
    except GrammarError as e:
        raise ToolError(str(e)) from None


class ToolCallReader:
    """feed(text) -> [("content", text) | ("call", Call), ...] as the reply streams; flush() at its end.

    Whitespace that only separates content from a call (or calls from each other) is dropped, so a reply that is all
    calls has no content."""

    def __init__(self, fmt: str, names: frozenset):
        if fmt not in FORMATS:
            raise ToolError(f"unknown tool-call format {fmt!r}")
        self.fmt, self.names = fmt, names
        self.held = ""  # text not yet read: maybe the start of a call
        self.state = "start" if fmt == "llama3" else "text"  # llama3: a reply that opens with { is a call
        self.ws = ""  # whitespace held back: it may turn out to stand before a call
        self.after_call = False
        self.calls = 0

    # -- what comes out

    def _content(self, out: list, text: str) -> None:
        text = self.ws + text
        body = text.rstrip()
        self.ws = text[len(body):]
        if self.after_call:
            body = body.lstrip()
        if body:
            out.append(("content", body))
            self.after_call = False

    def _call(self, out: list, call: Call | None, raw: str) -> None:
        if call is None:  # not a call after all: the model's text, as it wrote it
            self._content(out, raw)
            return
        self.ws, self.after_call = "", True
        self.calls += 1
        out.append(("call", call))

    def _make(self, name, arguments) -> Call | None:
        if not isinstance(name, str) or name not in self.names:
            return None
        if isinstance(arguments, str):  # arguments written as a JSON string holding the object
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return Call(call_id(self.fmt), name, json.dumps(arguments, ensure_ascii=False))

    def _json_call(self, text: str) -> Call | None:
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or set(obj) - {"name", "arguments", "parameters"}:
            return None
        return self._make(obj.get("name"), obj.get("arguments", obj.get("parameters")))

    # -- reading

    def feed(self, text: str) -> list:
        out: list = []
        self.held += text
        if self.fmt == "hermes":
            self._hermes(out)
        elif self.fmt == "mistral":
            self._mistral_text(out)
        else:
            self._llama3_start(out)
        return out

    def flush(self) -> list:
        out: list = []
        if self.fmt == "hermes":
            if self.state == "call":  # a call the reply never closed (it ended, or ran out of tokens)
                body, self.held, self.state = self.held, "", "text"
                self._call(out, self._json_call(body.strip()), HERMES_OPEN + body)
        elif self.fmt == "mistral" and self.state == "calls":
            self._mistral_calls(out)
        elif self.fmt == "llama3" and self.state == "json":
            self._llama3_calls(out)
        if self.held:
            self._content(out, self.held)
            self.held = ""
        if not self.calls and self.ws:  # a reply without calls keeps its trailing whitespace
            out.append(("content", self.ws))
        self.ws = ""
        return out

    def _text_until(self, out: list, marker: str) -> bool:
        """Content up to `marker` (True: found, and held starts after it), or up to a possible start of it."""
        i = self.held.find(marker)
        if i >= 0:
            self._content(out, self.held[:i])
            self.held = self.held[i + len(marker):]
            return True
        keep = _partial(self.held, marker)
        self._content(out, self.held[:len(self.held) - keep])
        self.held = self.held[len(self.held) - keep:]
        return False

    def _hermes(self, out: list) -> None:
        while self.held:
            if self.state == "text":
                if not self._text_until(out, HERMES_OPEN):
                    return
                self.state = "call"
            i = self.held.find(HERMES_CLOSE)
            if i < 0:
                return
            body = self.held[:i]
            self.held, self.state = self.held[i + len(HERMES_CLOSE):], "text"
            self._call(out, self._json_call(body.strip()), HERMES_OPEN + body + HERMES_CLOSE)

    def _mistral_text(self, out: list) -> None:
        if self.state == "text" and self._text_until(out, MISTRAL_MARK):
            self.state = "calls"  # the rest of the reply is calls: read whole at its end

    def _mistral_calls(self, out: list) -> None:
        rest, self.held = self.held, ""
        raw = MISTRAL_MARK + rest
        calls: list = []
        for part in rest.split(MISTRAL_MARK):
            if part.lstrip().startswith("["):  # a JSON list of calls
                try:
                    listed = json.loads(part)
                except ValueError:
                    return self._call(out, None, raw)
                if not isinstance(listed, list) or not listed:
                    return self._call(out, None, raw)
                for c in listed:
                    call = self._make(c.get("name"), c.get("arguments")) if isinstance(c, dict) else None
                    if call is None:
                        return self._call(out, None, raw)
                    calls.append(call)
                continue
            m = _MISTRAL_NAMED.match(part)
            call = None
            if m:
                try:
                    args, end = json.JSONDecoder().raw_decode(part, m.end())
                except ValueError:
                    args, end = None, 0
                call = self._make(m.group(1), args) if not part[end:].strip() else None
            if call is None:
                return self._call(out, None, raw)
            calls.append(call)
        for call in calls:
            self._call(out, call, "")

    def _llama3_start(self, out: list) -> None:
        if self.state == "start":
            stripped = self.held.lstrip()
            if not stripped:
                return
            self.state = "json" if stripped.startswith("{") else "text"
        if self.state == "text":
            self._content(out, self.held)
            self.held = ""

    def _llama3_calls(self, out: list) -> None:
        text, self.held = self.held, ""
        calls, at, decoder = [], 0, json.JSONDecoder()
        while True:
            at = len(text) - len(text[at:].lstrip())
            try:
                obj, at = decoder.raw_decode(text, at)
            except ValueError:
                return self._call(out, None, text)
            call = self._json_call(json.dumps(obj)) if isinstance(obj, dict) else None
            if call is None:
                return self._call(out, None, text)
            calls.append(call)
            rest = text[at:].lstrip()
            if not rest:
                break
            if not rest.startswith(";"):  # several calls are written separated by semicolons
                return self._call(out, None, text)
            at = len(text) - len(rest) + 1
        for call in calls:
            self._call(out, call, "")


def read(fmt: str, names, text: str) -> tuple[str | None, list[Call]]:
    """(content, calls) of a whole reply; content is None when the reply is calls only."""
    r = ToolCallReader(fmt, frozenset(names))
    events = r.feed(text) + r.flush()
    calls = [c for k, c in events if k == "call"]
    content = "".join(t for k, t in events if k == "content")
    return (content or None) if calls else content, calls


def template_messages(messages: list) -> list:
    """Messages as the chat template takes them (as vLLM passes them): an assistant's tool calls with their arguments
    as objects (the templates write `arguments | tojson`), and its absent content as ""."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "assistant":
            if m.get("content") is None:
                m["content"] = ""
            if m.get("tool_calls"):
                m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(
                    c["function"]["arguments"])}} for c in m["tool_calls"]]
        out.append(m)
    return out
