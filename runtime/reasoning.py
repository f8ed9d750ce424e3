"""A reasoning model's reply split into its thinking and its answer (OpenAI-style servers' `reasoning_content`).

Templates that ask the model to think (Qwen3, DeepSeek-R1 and their kind) have it write `<think>...</think>` before
the answer, or open the `<think>` themselves at the end of the prompt. A reply is split only for such a template
(one that mentions `</think>`): the text between the tags is the reasoning, what follows the answer (its leading
newlines dropped). The template's switch (Qwen3's `enable_thinking: false`, passed as `chat_template_kwargs`) closes
an empty thinking block in the prompt, and the reply is then all answer.

The splitter takes the reply as it streams, in pieces of any size: a piece that ends with the start of a tag is held
back until the next one shows whether it is the tag, so the parts streamed are the parts of the whole reply.
"""
from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def thinks(template: str | None) -> bool:
    """The template has the model write a thinking block."""
    return bool(template) and CLOSE in template


def prompt_opens_thinking(tokenizer, ids) -> bool:
    """The prompt ends inside an open thinking block (the template wrote `<think>` for the model)."""
    tail = tokenizer.decode(list(ids[-16:]), skip_special_tokens=False)
    return tail.rfind(OPEN) > tail.rfind(CLOSE)


class ReasoningSplitter:
    """feed(text) -> [("reasoning" | "content", text), ...] as the reply streams; flush() at its end."""

    def __init__(self, thinking: bool = False):
        # start: nothing seen yet (a reply may open with <think>); reasoning; content
        self.state = "reasoning" if thinking else "start"
        self.thought = thinking  # a thinking block was opened (the reply has reasoning, maybe empty)
        self.held = ""
        self.after_close = False  # drop the newlines that follow </think>

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        self.held += text
        while self.held:
            if self.state == "start":
                stripped = self.held.lstrip()
                if stripped.startswith(OPEN):
                    self.held, self.state, self.thought = stripped[len(OPEN):], "reasoning", True
                    continue
                if OPEN.startswith(stripped):  # maybe the tag, not all here yet
                    break
                self.state = "content"
                continue
            if self.state == "reasoning":
                i = self.held.find(CLOSE)
                if i >= 0:
                    self._emit(out, "reasoning", self.held[:i])
                    self.held, self.state, self.after_close = self.held[i + len(CLOSE):], "content", True
                    continue
                keep = tag_prefix(self.held, CLOSE)
                self._emit(out, "reasoning", self.held[:len(self.held) - keep])
                self.held = self.held[len(self.held) - keep:]
                break
            if self.after_close:
                self.held = self.held.lstrip("\n")
                if not self.held:
                    break
                self.after_close = False
            self._emit(out, "content", self.held)
            self.held = ""
        return out

    def flush(self) -> list[tuple[str, str]]:
        """What is held back, at the end of the reply (an unclosed thinking block stays reasoning)."""
        out: list[tuple[str, str]] = []
        if self.held and not (self.after_close and not self.held.strip("\n")):
            self._emit(out, "reasoning" if self.state == "reasoning" else "content", self.held)
        self.held = ""
        return out

    @staticmethod
    def _emit(out: list, kind: str, text: str) -> None:
        if text:
            out.append((kind, text))


def tag_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def split(text: str, thinking: bool = False) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole reply."""
    s = ReasoningSplitter(thinking)
    parts = s.feed(text) + s.flush()
    reasoning = "".join(t for k, t in parts if k == "reasoning")
    return reasoning if s.thought else None, "".join(t for k, t in parts if k == "content")
