"""Chat templates rendered as transformers renders them, with limits on the work a template may do.

A chat template is code that comes with the model's files. jinja2's immutable sandbox keeps it away
from Python's internals, but not from the machine: `{% for i in range(100000) %}{% for j in
range(100000) %}` runs for hours, `{{ 'a' * 400000000 }}` allocates 400 MB (and the tokenizer then
aborts on it), `{% set ns.s = ns.s ~ ns.s %}` in a loop doubles a string until memory runs out. So a
render here runs under `TemplateLimits`, checked in-process where a template does work:

- every loop iteration and every call (macros, methods, globals) is a step, counted against
  `max_steps`, and each step checks the wall clock against `max_seconds`: a runaway loop stops within
  one step of its limit, whatever it loops over (the code generator wraps each `for` iterable);
- `range()` is limited to `max_range` items;
- operators that build values (`*`, `+`, `**`, `%`, `~`), filters and calls are refused *before* they
  build anything longer than `max_output` characters (estimated from their operands: `s * n`, a
  `replace` or `join`, a `tojson(indent=...)`, a format width, `2 ** n`), and their results are
  checked after; everything built or output, kept or not, is charged to `max_work` characters;
- the rendered text stops at `max_output` characters.

What is allowed renders exactly as before: the hooks only check and count, and the templates of
ChatML, SmolLM2, Llama 3 and Qwen2 come out character for character as `apply_chat_template`'s.
"""
from __future__ import annotations

import functools
import inspect
import json
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum


@dataclass(frozen=True)
class TemplateLimits:
    max_output: int = 1_000_000  # characters of rendered text, and of any one value a template builds
    max_seconds: float = 5.0  # wall clock of one render
    max_steps: int = 1_000_000  # loop iterations plus calls, over the whole render
    max_range: int = 10_000  # items of one range()
    max_work: int = 32_000_000  # characters built or output over the whole render, kept or not


class TemplateLimitError(jinja2.TemplateError):
    """A template that went past one of its limits (a TemplateError, so it is reported like one)."""


_MAX_INT_BITS = 100_000  # ints past this are unprintable anyway (Python's 4300-digit str limit)
# A width or precision of a million or more in a %-format or a str.format field, and fields whose width
# comes from an argument (%*d, {:{}}): those arguments count as widths.
_WIDE_FORMAT = re.compile(r"%[-+ #0]*\d*\.?\d{7,}|\{[^{}]*:[^{}]*\d{7,}[^{}]*\}")
_WIDTH_FROM_ARGS = re.compile(r"%[-+ #0]*\*|%[-+ #0]*\d*\.\*|\{[^{}]*\{")
# Filters whose work does not grow with the printed size of their input (the others are checked before they run).
_CHEAP_FILTERS = frozenset({"length", "count", "first", "last", "default", "d", "abs", "int", "float", "round",
                            "select", "reject", "selectattr", "rejectattr", "map", "items", "dictsort", "sort",
                            "reverse", "unique", "min", "max", "sum", "groupby", "attr", "random", "list", "batch",
                            "slice", "filesizeformat", "wordcount", "truncate", "trim", "lower", "upper", "title",
                            "capitalize", "striptags", "safe", "mark_safe"})


# Filters with an argument that is a size of what they build (center's width, slice's count, batch's padding,
# tojson's indent: json.dumps makes the indent string first, even for a scalar).
_SIZE_FILTERS = frozenset({"center", "indent", "batch", "slice", "wordwrap", "truncate", "tojson"})


def _size(value, limit: int, indent: int = 0, depth: int = 1) -> int:
    """An upper estimate of len(str(value)) (or of its JSON with `indent`), stopping once past `limit`."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, (bytes, bytearray)):
        return 4 * len(value)
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, float):
        return 24
    if isinstance(value, dict):
        items = [x for kv in value.items() for x in kv]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = value
    else:
        return 16
    total = 2
    for x in items:
        total += _size(x, limit - total, indent, depth + 1) + 2 + indent * depth
        if total > limit:
            break
    return total


def _ints(x, depth: int = 3):
    """The ints in x and in the lists, tuples and dicts it holds (a few levels down)."""
    if isinstance(x, int) and not isinstance(x, bool):
        yield x
    elif depth and isinstance(x, (list, tuple, dict)):
        for y in (x.values() if isinstance(x, dict) else x):
            yield from _ints(y, depth - 1)


def _name(obj) -> str:
    """What a template calls `obj` (our own globals are methods named _range, _lipsum)."""
    return (getattr(obj, "__name__", None) or type(obj).__name__).lstrip("_")


class _Budget:
    """One render's counters."""

    def __init__(self, limits: TemplateLimits):
        self.limits = limits
        self.deadline = time.monotonic() + limits.max_seconds
        self.steps = 0
        self.work = 0


class _CheckedIterable:
    """A `for` loop's iterable: every item is a step. len() passes through (loop.length, loop.last)."""

    def __init__(self, env: LimitedEnvironment, iterable):
        self.env, self.iterable = env, iterable

    def __len__(self) -> int:
        return len(self.iterable)

    def __iter__(self):
        for item in self.iterable:
            self.env.step()
            yield item


class _CountingCodeGenerator(CodeGenerator):
    """jinja's code generator with three hooks: loop iterables step, output is counted, `~` is checked.
    (jinja allows no custom node types, so a loop's iterable is recognised by identity when visited.)"""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._loop_iterables: set[int] = set()

    def visit_For(self, node: nodes.For, frame) -> None:
        self._loop_iterables.add(id(node.iter))
        super().visit_For(node, frame)

    def visit(self, node, *args, **kwargs):
        if id(node) not in self._loop_iterables:
            return super().visit(node, *args, **kwargs)
        self.write("environment.checked_iter(")
        super().visit(node, *args, **kwargs)
        self.write(")")

    def visit_Output(self, node: nodes.Output, frame) -> None:
        # Literal text is output without going through finalize: count it here (inside macros and
        # {% set %} blocks too, whose output is buffered where the top-level limit cannot see it).
        literal = 0
        for child in node.nodes:
            try:
                literal += len(str(child.as_const(frame.eval_ctx)))
            except Exception:  # not a constant: finalize counts it at run time
                pass
        if literal:
            self.writeline(f"environment.count_output({literal})")
        super().visit_Output(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class LimitedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' chat-template environment (immutable sandbox, trim_blocks, lstrip_blocks, loop
    controls, `{% generation %}`, tojson, raise_exception, strftime_now) with the limits above."""

    intercepted_binops = frozenset({"*", "+", "**", "%"})
    code_generator_class = _CountingCodeGenerator

    def __init__(self, limits: TemplateLimits | None = None):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
                         finalize=self._finalize)
        self.limits = limits or TemplateLimits()
        self._local = threading.local()
        self.filters["tojson"] = _tojson
        self.filters = {name: self._checked_filter(name, f) for name, f in self.filters.items()}
        self.globals.update(range=self._range, lipsum=self._lipsum, raise_exception=_raise_exception,
                            strftime_now=_strftime_now)

    # ---- rendering under a budget ---------------------------------------------------------------

    def render(self, template: jinja2.Template, context: dict) -> str:
        """The rendered text; a TemplateLimitError past a limit (jinja errors and the template's own
        exceptions pass through)."""
        outer = getattr(self._local, "budget", None)
        self._local.budget = _Budget(self.limits)
        try:
            out, n = [], 0
            for chunk in template.generate(**context):
                n += len(chunk)
                if n > self.limits.max_output:
                    raise TemplateLimitError(f"its output passed the limit of {self.limits.max_output} characters")
                out.append(chunk)
            return "".join(out)
        finally:
            self._local.budget = outer

    def _budget(self) -> _Budget | None:
        return getattr(self._local, "budget", None)  # None while jinja folds constants at compile time

    def step(self) -> None:
        b = self._budget()
        if b is None:
            return
        b.steps += 1
        if b.steps > b.limits.max_steps:
            raise TemplateLimitError(f"it ran past the limit of {b.limits.max_steps} loop iterations and calls "
                                     f"(a runaway loop?)")
        if time.monotonic() > b.deadline:
            raise TemplateLimitError(f"it ran for more than {b.limits.max_seconds:g} s (a runaway loop?)")

    def charge(self, chars: int, what: str) -> None:
        """Refuse a value of more than max_output characters before (or after) it is built, and count it."""
        if chars > self.limits.max_output:
            raise TemplateLimitError(f"{what} would build a value of more than {self.limits.max_output} characters")
        b = self._budget()
        if b is not None:
            b.work += chars
            if b.work > b.limits.max_work:
                raise TemplateLimitError(f"it built more than {b.limits.max_work} characters in all")

    def _result(self, value, what: str):
        self.charge(_size(value, self.limits.max_output), what)
        return value

    # ---- hooks of the generated code -------------------------------------------------------------

    def checked_iter(self, iterable):
        return _CheckedIterable(self, iterable)

    def count_output(self, chars: int) -> None:
        self.charge(chars, "its output")

    def checked_concat(self, parts) -> str:
        limit = self.limits.max_output
        self.charge(sum(_size(p, limit) for p in parts), "'~'")
        return "".join(map(str, parts))

    def _finalize(self, value):
        self.charge(_size(value, self.limits.max_output), "printing a value")
        return value

    # ---- the sandbox's interception points ---------------------------------------------------------

    def call_binop(self, context, operator: str, left, right):
        self.charge(self._binop_estimate(operator, left, right), f"'{operator}'")
        return self._result(super().call_binop(context, operator, left, right), f"'{operator}'")

    def _binop_estimate(self, op: str, a, b) -> int:
        limit = self.limits.max_output
        if op == "*":
            if isinstance(a, int) and not isinstance(b, int):
                a, b = b, a
            if isinstance(b, int) and not isinstance(a, int):
                return _size(a, limit) * max(b, 0)
            if isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > _MAX_INT_BITS:
                return limit + 1
        elif op == "**" and isinstance(a, int) and isinstance(b, int) and abs(a) > 1 and b > 0:
            return (limit + 1) if a.bit_length() * b > _MAX_INT_BITS else 0
        elif op == "+":
            return _size(a, limit) + _size(b, limit) if not isinstance(a, (int, float)) else 0
        elif op == "%" and isinstance(a, str):
            return self._format_estimate(a, b)
        return 0

    def _format_estimate(self, fmt: str, args) -> int:
        """A format string's output: its length, its arguments', and the int arguments that may be widths."""
        if _WIDE_FORMAT.search(fmt):
            return self.limits.max_output + 1
        widths = sum(abs(i) for i in _ints(args)) if _WIDTH_FROM_ARGS.search(fmt) else 0
        return len(fmt) + _size(args, self.limits.max_output) + widths

    def call(self, context, obj, /, *args, **kwargs):
        self.step()
        s = getattr(obj, "__self__", None)
        if isinstance(s, str) and _name(obj) == "join" and args and not isinstance(args[0], (str, list, tuple)):
            args = (list(args[0]), *args[1:])  # an iterator (a map filter's): its items are needed to measure it
        self._check_call(obj, args, kwargs)
        return self._result(super().call(context, obj, *args, **kwargs), f"calling {_name(obj)}")

    def _check_call(self, obj, args, kwargs) -> None:
        """An int argument of a builtin may be a size ('a'.center(n), (5).to_bytes(n), range): none over
        max_output. Format arguments are values (their widths are estimated), macros are checked inside."""
        limit = self.limits.max_output
        sizes = not (getattr(obj, "formats_checked", False) or isinstance(obj, jinja2.runtime.Macro))
        for a in (*args, *kwargs.values()) if sizes else ():
            if isinstance(a, int) and abs(a) > limit:
                raise TemplateLimitError(f"calling {_name(obj)} with {a} is over the limit of {limit}")
        s = getattr(obj, "__self__", None)
        if isinstance(s, str) and args:
            self.charge(self._str_method_estimate(_name(obj), s, args), f"str.{_name(obj)}")

    def _str_method_estimate(self, name: str, s: str, args) -> int:
        limit = self.limits.max_output
        if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            return len(s) + (s.count(args[0]) + (not args[0])) * max(len(args[1]) - len(args[0]), 0)
        if name == "join" and isinstance(args[0], (list, tuple)):
            return len(s) * len(args[0]) + _size(args[0], limit)
        if name == "expandtabs" and isinstance(args[0], int):
            return len(s) + s.count("\t") * args[0]
        if name == "translate" and isinstance(args[0], dict):
            return len(s) * max((_size(v, limit) for v in args[0].values()), default=1)
        return 0

    def wrap_str_format(self, value):
        fmt = super().wrap_str_format(value)
        if fmt is None:
            return None
        template = value.__self__

        @functools.wraps(fmt)
        def checked(*args, **kwargs):
            self.charge(self._format_estimate(template, (args, kwargs)), "str.format")
            return fmt(*args, **kwargs)
        checked.formats_checked = True
        return checked

    def _checked_filter(self, name: str, f):
        estimate = _FILTER_ESTIMATES.get(name)
        precheck = name not in _CHEAP_FILTERS
        sizes = name in _SIZE_FILTERS
        first = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0  # a context / environment comes first

        @functools.wraps(f)  # keeps jinja_pass_arg
        def checked(*args, **kwargs):
            self.step()
            if name == "join" and len(args) > first and not isinstance(args[first], (str, list, tuple, dict)):
                args = (*args[:first], list(args[first]), *args[first + 1:])  # measure an iterator's items
            limit = self.limits.max_output
            for a in (*args[first + 1:], *kwargs.values()) if sizes else ():
                if isinstance(a, int) and abs(a) > limit:
                    raise TemplateLimitError(f"the filter {name} with {a} is over the limit of {limit}")
            if precheck and len(args) > first:
                self.charge(estimate(self, args[first], args[first + 1:], kwargs) if estimate
                            else _size(args[first], limit), f"the filter {name}")
            return self._result(f(*args, **kwargs), f"the filter {name}")
        return checked

    def _range(self, *args) -> range:
        r = range(*args)
        if len(r) > self.limits.max_range:
            raise TemplateLimitError(f"range() of {len(r)} items is over the limit of {self.limits.max_range}")
        return r

    def _lipsum(self, *args, **kwargs) -> str:
        a = inspect.signature(generate_lorem_ipsum).bind(*args, **kwargs)
        a.apply_defaults()
        words = max(a.arguments["min"], a.arguments["max"], 0)
        self.charge(12 * max(a.arguments["n"], 0) * words, "lipsum")
        return generate_lorem_ipsum(*a.args, **a.kwargs)


def _replace_estimate(env, value, args, kwargs) -> int:
    old, new = (list(args) + [kwargs.get("old"), kwargs.get("new")])[:2]
    s = str(value) if isinstance(value, str) else ""
    if isinstance(old, str) and isinstance(new, str):
        return len(s) + (s.count(old) + (not old)) * max(len(new) - len(old), 0)
    return _size(value, env.limits.max_output)


def _join_estimate(env, value, args, kwargs) -> int:
    sep = args[0] if args else kwargs.get("d", "")
    items = value if isinstance(value, (list, tuple)) else ()
    return _size(value, env.limits.max_output) + len(str(sep)) * len(items)


def _tojson_estimate(env, value, args, kwargs) -> int:
    indent = kwargs.get("indent", args[1] if len(args) > 1 else None)
    width = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    return _size(value, env.limits.max_output, indent=max(width, 0)) + max(width, 0)


def _indent_estimate(env, value, args, kwargs) -> int:
    width = args[0] if args else kwargs.get("width", 4)
    width = len(width) if isinstance(width, str) else width if isinstance(width, int) else 4
    s = value if isinstance(value, str) else ""
    return _size(value, env.limits.max_output) + (s.count("\n") + 1) * max(width, 0)


def _format_filter_estimate(env, value, args, kwargs) -> int:
    return env._format_estimate(value, (args, kwargs)) if isinstance(value, str) else _size(value, env.limits.max_output)


def _wordwrap_estimate(env, value, args, kwargs) -> int:
    names = ("width", "break_long_words", "wrapstring")
    a = dict(zip(names, args), **kwargs)
    width, wrap = a.get("width", 79), a.get("wrapstring") or "\n"
    s = value if isinstance(value, str) else ""
    lines = len(s) // max(width if isinstance(width, int) else 1, 1) + s.count("\n") + 1
    return _size(value, env.limits.max_output) + lines * _size(wrap, env.limits.max_output)


def _urlize_estimate(env, value, args, kwargs) -> int:
    extra = sum(_size(v, env.limits.max_output) for v in (*args, *kwargs.values()) if isinstance(v, str))
    s = value if isinstance(value, str) else ""
    return 2 * _size(value, env.limits.max_output) + (len(s) // 4 + 1) * (extra + 64)


def _center_estimate(env, value, args, kwargs) -> int:
    width = args[0] if args else kwargs.get("width", 80)
    return _size(value, env.limits.max_output) + (width if isinstance(width, int) else 0)


_FILTER_ESTIMATES = {"replace": _replace_estimate, "join": _join_estimate, "tojson": _tojson_estimate,
                     "indent": _indent_estimate, "format": _format_filter_estimate, "center": _center_estimate,
                     "wordwrap": _wordwrap_estimate, "urlize": _urlize_estimate}


# ---- transformers' helpers -----------------------------------------------------------------------

def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson, not jinja's: no HTML escaping of <>&', and non-ASCII kept as is.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; render its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)
