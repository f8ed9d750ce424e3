"""OpenAI's request bodies as this server takes them (runtime/server.py): every field checked, with OpenAI's error
body for what is refused. A field the API defines that this server does not implement is accepted only at the value
at which it changes nothing (compared with its type: `true` is not 1), anything else is a 400 naming the field,
never silently ignored.
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from .generate import MAX_LOGPROBS
from .grammar import Grammar, GrammarError
from .sampler import OPENAI, SamplingDefaults, resolve_sampling
from .tools import MISTRAL_MARKERS as MARKERS
from .tools import ToolError, ToolUse, template_format, template_messages

# field -> the values at which an unimplemented OpenAI field changes nothing (accepted; compared with their
# type, so that true is not 1), or the type of a field that changes nothing at any value (None too)
NO_OP = {"frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logit_bias": (None, {}), "user": str,
         "service_tier": (None, "auto", "default"), "store": (None, False), "metadata": dict,
         "suffix": (None,), "best_of": (None, 1)}
COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options",
          "response_format", "logprobs", "grammar"}
FIELDS = {"chat": COMMON | {"messages", "max_completion_tokens", "top_logprobs", "chat_template_kwargs", "tools",
                            "tool_choice", "parallel_tool_calls"},
          "completion": COMMON | {"prompt", "echo"}}
ROLES = ("system", "user", "assistant", "tool")
MAX_TOOLS = 128  # OpenAI's limit
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
RESERVED_TEMPLATE_NAMES = {"messages", "add_generation_prompt", "tools", "documents"}


def is_no_op(key: str, value) -> bool:
    allowed = NO_OP[key]
    if isinstance(allowed, type):
        return value is None or isinstance(value, allowed)
    return any(type(v) is type(value) and v == value for v in allowed)


class RequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def shutting_down() -> RequestError:
    return RequestError(503, "the server is shutting down; retry the request later or on another server",
                        code="server_shutting_down", kind="server_error")


def _text(i: int, content) -> str | None:
    """A message's content as text: a string, or text parts joined (anything but text is refused: this server reads
    text); None stays None (checked by the caller)."""
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise RequestError(400, f"messages[{i}].content: only text parts are supported by this server",
                               "messages", "unsupported_content")
        return "".join(p["text"] for p in content)
    return content


def message(i: int, m) -> dict:
    """A chat message as the template takes it: OpenAI's "developer" role is the system prompt, content given as
    parts joins its text parts; an assistant's `tool_calls` (its content may then be null) and a `tool` message's
    `tool_call_id` are kept for the template."""
    role = m.get("role") if isinstance(m, dict) else None
    role = "system" if role == "developer" else role
    content = _text(i, m.get("content")) if isinstance(m, dict) else None
    calls = m.get("tool_calls") if role == "assistant" else None
    if role not in ROLES or not (isinstance(content, str) or (content is None and calls)):
        raise RequestError(400, f"messages[{i}] must be {{'role': one of {', '.join(ROLES)}, 'content': a string or "
                                f"text parts}} (an assistant's content may be null beside its tool_calls)", "messages")
    out = {"role": role, "content": content}
    if calls is not None:
        if not isinstance(calls, list):
            raise RequestError(400, f"messages[{i}].tool_calls must be a list of calls", "messages")
        out["tool_calls"] = [assistant_call(i, k, c) for k, c in enumerate(calls)]
    if role == "tool":
        tid = m.get("tool_call_id")
        if not isinstance(tid, str) or not tid:
            raise RequestError(400, f"messages[{i}]: a tool message needs the tool_call_id it answers", "messages")
        out["tool_call_id"] = tid
    if isinstance(m.get("name"), str) and role in ("tool", "user", "system"):
        out["name"] = m["name"]
    return out


def assistant_call(i: int, k: int, c) -> dict:
    """One of an assistant message's tool_calls: {"id", "type": "function", "function": {"name", "arguments": a
    JSON object as text}}."""
    f = c.get("function") if isinstance(c, dict) else None
    ok = isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("arguments"), str)
    try:
        ok = ok and isinstance(json.loads(f["arguments"]), dict)
    except ValueError:
        ok = False
    if not ok or c.get("type", "function") != "function":
        raise RequestError(400, f"messages[{i}].tool_calls[{k}] must be {{'id': ..., 'type': 'function', 'function': "
                                f"{{'name': ..., 'arguments': a JSON object as a string}}}}", "messages")
    return {"id": str(c.get("id", "")), "type": "function", "function": {"name": f["name"], "arguments": f["arguments"]}}


def tool_use(body: dict, tool_format: str | None) -> ToolUse | None:
    """The request's tools and tool_choice, checked; None when the template is to get no tools (none given, or
    tool_choice "none")."""
    tools, choice, parallel = body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError(400, f"parallel_tool_calls must be true or false, got {parallel!r}", "parallel_tool_calls")
    if tools is not None:
        if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
            raise RequestError(400, f"tools must be a list of at most {MAX_TOOLS} functions", "tools")
        for k, t in enumerate(tools):
            f = t.get("function") if isinstance(t, dict) else None
            if not (isinstance(f, dict) and t.get("type") == "function" and isinstance(f.get("name"), str)
                    and TOOL_NAME.fullmatch(f["name"]) and isinstance(f.get("parameters", {}), dict)
                    and isinstance(f.get("description", ""), str)):
                raise RequestError(400, f"tools[{k}] must be {{'type': 'function', 'function': {{'name': 1 to 64 "
                                        f"letters, digits, _ or -, 'description': ..., 'parameters': a JSON schema}}}}",
                                   "tools")
    names = [t["function"]["name"] for t in tools or []]
    if len(set(names)) != len(names):
        raise RequestError(400, "tools: two functions have the same name", "tools")
    if choice is None:
        choice = "auto" if names else "none"
    elif isinstance(choice, dict):
        f = choice.get("function") if choice.get("type") == "function" else None
        name = f.get("name") if isinstance(f, dict) else None
        if name not in names:
            raise RequestError(400, f"tool_choice names the function {name!r}, which is not among the tools "
                                    f"({', '.join(names) or 'none given'})", "tool_choice", "invalid_tool_choice")
        choice = name
    elif choice not in ("none", "auto", "required"):
        raise RequestError(400, f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'function': "
                                f"{{'name': ...}}}}, got {choice!r}", "tool_choice", "invalid_tool_choice")
    elif choice != "none" and not names:
        raise RequestError(400, f"tool_choice {choice!r} needs tools", "tool_choice", "invalid_tool_choice")
    if choice == "none":
        return None
    if tool_format is None:
        raise RequestError(400, "tools: this model's chat template has no tool-call format deploycc reads (Hermes/Qwen "
                                "<tool_call>, Llama 3.x JSON, Mistral [TOOL_CALLS]); compile the package with "
                                "--chat-template FILE of one that has, or send tool_choice 'none'", "tools",
                           "unsupported_tools")
    return ToolUse(tool_format, tuple(tools), choice, parallel is not False)


@dataclass(frozen=True)
class Request:
    """A checked request: the prompt, generate's options, and what the server does around generation."""
    prompt: object  # messages or text
    options: dict  # runtime/generate.py's keyword arguments
    stream: bool = False
    include_usage: bool = False
    n: int = 1  # choices
    echo: bool = False  # the reply's text starts with the prompt (completions)
    template_kwargs: dict | None = None  # more variables for the chat template (chat_template_kwargs, tools)
    tools: ToolUse | None = None  # the reply is read for tool calls (runtime/tools.py)


def parse(body, kind: str, model_name: str, model_sampling: SamplingDefaults | None = None, max_n: int = 1,
          tokenizer=None) -> Request:
    """A request body for `model_name`, every field checked (n: the choices, up to `max_n`, the sequences the server
    runs at once; `tokenizer`: the model's, whose chat template says how tools are called).
    The sampler settings a request does not give come from `model_sampling` (the model's generation_config.json),
    else OpenAI's defaults: temperature 1, top_p 1 (runtime/sampler.py: resolve_sampling)."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    for key, value in body.items():
        if key in FIELDS[kind]:
            continue
        if key in NO_OP and is_no_op(key, value):
            continue
        allowed = NO_OP.get(key)
        what = ("is not supported by this server" if isinstance(allowed, tuple) else
                f"must be {getattr(allowed, '__name__', '')}" if allowed else "is not a field of this endpoint")
        raise RequestError(400, f"{key} {what}" + (f" (only {allowed[-1]!r})" if isinstance(allowed, tuple) else
                                                   ""), key, "unsupported_parameter")
    model = body.get("model")
    if model != model_name:
        raise RequestError(404, f"The model '{model}' does not exist; this server has '{model_name}'", "model",
                           "model_not_found")
    n = body.get("n")
    n = 1 if n is None else n
    if type(n) is not int or not 1 <= n <= max_n:
        raise RequestError(400, f"n must be an integer from 1 to {max_n} (the sequences this server runs at once), "
                                f"got {n!r}", "n")
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
    echo = body.get("echo", False) if kind == "completion" else False
    if not isinstance(echo, bool):
        raise RequestError(400, f"echo must be true or false, got {echo!r}", "echo")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = 256 if max_tokens is None else max_tokens
    least = 0 if echo and body.get("logprobs") is not None else 1  # lm-eval's scoring: the prompt's logprobs alone
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < least:
        raise RequestError(400, f"max_tokens must be an integer >= {least}" + (" (0 with echo and logprobs)" if least
                                else "") + f", got {max_tokens!r}", "max_tokens")
    given = {}
    for key, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        v = body.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi or (key == "top_p" and v == 0):
            raise RequestError(400, f"{key} must be a number in {'(' if key == 'top_p' else '['}{lo}, {hi}], "
                                    f"got {v!r}", key)
        given[key] = float(v)
    options = {"max_tokens": max_tokens, **resolve_sampling(given, model_sampling, OPENAI, "the request").options()}
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not -1 <= seed < 1 << 64):
        raise RequestError(400, f"seed must be an integer from 0 to 2**64-1 (or -1: a random one), got {seed!r}",
                           "seed")
    # without a seed (or -1, llama-server's spelling), each request samples anew, as OpenAI's API does
    options["seed"] = secrets.randbits(64) if seed in (None, -1) else seed
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
    grammar = response_format(body.get("response_format"))
    text = body.get("grammar")  # llama-server's extension: a GBNF (or Lark) grammar
    if text is not None:
        if grammar is not None or not isinstance(text, str) or not text.strip():
            raise RequestError(400, "grammar must be a non-empty GBNF or Lark grammar, without a JSON "
                                    "response_format", "grammar")
        try:
            grammar = Grammar.text(text, "grammar")
        except GrammarError as e:
            raise RequestError(400, str(e), "grammar", "invalid_grammar") from None
    if grammar is not None:
        options["grammar"] = grammar
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict) or set(kwargs) & RESERVED_TEMPLATE_NAMES:
            raise RequestError(400, "chat_template_kwargs must be an object of template variables (e.g. "
                                    "{'enable_thinking': false}), not setting messages, add_generation_prompt, tools "
                                    "or documents", "chat_template_kwargs")
    tools = tool_use(body, template_format(getattr(tokenizer, "chat_template", None))) if kind == "chat" else None
    if tools is not None:
        kwargs = {**(kwargs or {}), "tools": list(tools.tools)}
        if tools.choice != "auto":  # "required" or a named function: only calls may be written
            if grammar is not None:
                raise RequestError(400, f"tool_choice {body.get('tool_choice')!r} cannot be combined with "
                                        "response_format or grammar", "tool_choice")
            try:
                options["grammar"] = tools.grammar(tokenizer)
            except ToolError as e:
                raise RequestError(400, f"tools: {e}", "tools") from None
        if tools.fmt == "mistral":  # its markers are control tokens, which replies leave out of their text
            options["keep_special"] = tuple(i for i in map(tokenizer.token_to_id, MARKERS) if i is not None)
    top = logprobs_option(body, kind)
    if top is not None:
        options["logprobs"] = top
        if echo:  # the prompt's log probabilities too: one prefill with every position's logits
            options["prompt_logprobs"] = top
    if kind == "chat":
        prompt = template_messages(prompt)
    return Request(prompt, options, stream, bool((so or {}).get("include_usage", False)), n, echo, kwargs, tools)


def logprobs_option(body: dict, kind: str) -> int | None:
    """How many most likely tokens to list beside each sampled one (None: no log probabilities). Chat:
    `logprobs: true` with `top_logprobs` 0-20; completions: `logprobs` 0-20 (OpenAI's legacy field)."""
    lp, top = body.get("logprobs"), body.get("top_logprobs")
    if kind == "completion":
        if lp is None:
            return None
        if type(lp) is not int or not 0 <= lp <= MAX_LOGPROBS:
            raise RequestError(400, f"logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {lp!r}", "logprobs")
        return lp
    if lp not in (None, True, False) or type(lp) not in (type(None), bool):
        raise RequestError(400, f"logprobs must be true or false, got {lp!r}", "logprobs")
    if top is not None and (type(top) is not int or not 0 <= top <= MAX_LOGPROBS):
        raise RequestError(400, f"top_logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {top!r}",
                           "top_logprobs")
    if top is not None and not lp:
        raise RequestError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if lp else None


def response_format(rf) -> Grammar | None:
    """OpenAI's response_format: {"type": "text"} (None), {"type": "json_object"} (any JSON object), or
    {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}} (a document of the schema:
    structured output is always strict here, every token checked against the schema)."""
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind not in ("text", "json_object", "json_schema") or set(rf) - {"type", "json_schema"}:
        raise RequestError(400, "response_format must be {'type': 'text'}, {'type': 'json_object'} or {'type': "
                                "'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}", "response_format")
    try:
        if kind == "text":
            return None
        if kind == "json_object":
            return Grammar.json_object()
        js = rf.get("json_schema")
        if not isinstance(js, dict) or set(js) - {"name", "schema", "strict", "description"}:
            raise RequestError(400, "response_format.json_schema must be {'name': ..., 'schema': {...}, 'strict': "
                                    "bool, 'description': ...}", "response_format")
        name = js.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise RequestError(400, "response_format.json_schema.name must be a string of 1 to 64 characters",
                               "response_format")
        if js.get("strict") not in (None, True, False):
            raise RequestError(400, "response_format.json_schema.strict must be true or false", "response_format")
        schema = js.get("schema", {})
        return Grammar.json_schema(schema, f"response_format.json_schema.schema ({name})")
    except GrammarError as e:
        raise RequestError(400, str(e), "response_format", "invalid_response_format") from None
