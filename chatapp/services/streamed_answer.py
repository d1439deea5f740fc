"""What a stream shows of an answer while it is written: its text, and each call as it is written.

Text is released as it comes, except what could begin a call (the format's opening, and the
blank space before it). Once a call opens, the rest is calls: where the format's calls can be
read as they are written (JSON calls: Hermes' blocks, Llama 3's), each call is announced once
its function is known (after an opening, as soon as the grammar leaves its name one choice) and
its arguments follow piece by piece, so a client sees the call begin tokens after it does
(Claude Code's, Codex's first event); other formats' calls are sent whole once the answer ends.
Every API's stream (Anthropic's, OpenAI's two, Ollama's) reads
this one class; the screen reads its text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from chatapp.prompting.call_reader import ArgumentsWritten, CallNamed, CallWritten, JsonCallReader
from chatapp.prompting.harmony import HarmonyReader
from chatapp.prompting.prompt import PromptBuilder
from chatapp.services.answer_shape import AnswerShape, ShapedAnswer, speaks_harmony
from chatapp.tools import ToolCall


@dataclass(frozen=True)
class CallBegins:
    """The answer's call number `index` began: its id (given here) and its function."""

    index: int
    call_id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    """More of call `index`'s arguments: JSON text, its pieces joined a JSON object."""

    index: int
    text: str


@dataclass(frozen=True)
class CallEnds:
    """Call `index`'s arguments are complete, or (`complete` False) the answer ended before they were."""

    index: int
    complete: bool = True


CallShown = CallBegins | CallArguments | CallEnds
Shown = str | CallShown  # a piece of text, or news of a call


class StreamedContent:
    """The text and calls a stream shows while an answer is written.

    The text pieces always join to the content of the whole answer, and the calls shown are
    the calls it read, with the ids given when they began. A harmony answer (gpt-oss), with
    tools or without, shows only its preambles' and reply's text.
    """

    def __init__(self, shape: AnswerShape, builder: PromptBuilder | None) -> None:
        form = builder.tool_format if shape.calls_tools and builder is not None else None
        self._trigger = form.trigger if form is not None else None
        self._leads = form.leads if form is not None else None  # what alone may come before a call
        self._ids = form.call_ids if form is not None else None
        self._reader: JsonCallReader | None = form.call_reader() if form is not None else None
        if self._reader is not None:
            self._reader.names_held_to(shape.names_held_by_grammar())
        self._harmony = HarmonyReader() if speaks_harmony(builder) else None
        self._held = ""  # text not shown yet: blank space and what may begin a call
        self._shown = 0  # characters shown
        self._opened = False  # a call began: no more text is shown
        self._begun: list[CallBegins] = []  # the calls announced so far
        self._written = 0  # how many of them are complete
        self._news: list[CallShown] = []  # calls' news not yet taken

    def feed(self, piece: str) -> str:
        """The part of the answer's text to show now (only the held-back tail is looked at: no work grows
        with the answer); news of its calls waits in `calls()`."""
        if self._harmony is not None:
            shown = self._harmony.feed(piece)
            self._shown += len(shown)
            return shown
        if self._opened:
            self._read_calls(piece)
            return ""
        if self._trigger is None:
            self._shown += len(piece)
            return piece
        held = self._held + piece
        if self._leads is not None and not self._may_open(held, self._leads, self._trigger):
            self._trigger = None  # the answer began as text: a call's opening later in it is text too
            self._held = ""
            self._shown += len(held)
            return held
        start = held.find(self._trigger)
        if self._leads is not None and start < 0:
            self._held = held  # nothing shown while the answer may still be a call
            return ""
        self._opened = start >= 0
        end = start if self._opened else len(held) - _partial_opening(held, self._trigger)
        released = held[:end].rstrip()
        self._held = held[len(released) :]
        self._shown += len(released)
        if self._opened:
            self._read_calls(held[start:])
        return released

    def calls(self) -> list[CallShown]:
        """News of the calls since the last time asked (after the text `feed` returned)."""
        news, self._news = self._news, []
        return news

    def rest(self, answer: ShapedAnswer) -> str:
        """What is left of the text once the answer ended (held-back text that began no call)."""
        if self._begun:
            return ""  # the text before the first call was shown; what follows it was its calls
        rest = answer.content[self._shown :] if len(answer.content) > self._shown else ""
        self._shown = max(self._shown, len(answer.content))
        return rest

    def ending(self, answer: ShapedAnswer) -> list[CallShown]:
        """The calls' last news once the answer ended: each call begun is complete or cut, and each call
        not yet shown (a format read whole) is shown whole."""
        calls = answer.calls
        news: list[CallShown] = [CallEnds(begun.index, complete=False) for begun in self._begun[self._written :]]
        self._written = len(self._begun)
        for index in range(len(self._begun), len(calls)):
            call = calls[index]
            news += [CallBegins(index, call.id, call.name), CallArguments(index, call.arguments_json), CallEnds(index)]
        return news

    def as_streamed(self, calls: Sequence[ToolCall]) -> tuple[ToolCall, ...]:
        """`calls` (as the whole answer reads them) with the ids the stream gave those it announced."""
        given = {begun.index: begun.call_id for begun in self._begun}
        return tuple(replace(call, id=given.get(index, call.id)) for index, call in enumerate(calls))

    def _read_calls(self, text: str) -> None:
        if self._reader is None or self._ids is None:
            return
        for news in self._reader.feed(text):
            if isinstance(news, CallNamed):
                begun = CallBegins(
                    len(self._begun),
                    self._ids.for_call(news.call_id, [begun.call_id for begun in self._begun]),
                    news.name,
                )
                self._begun.append(begun)
                self._news.append(begun)
            elif isinstance(news, ArgumentsWritten):
                self._news.append(CallArguments(len(self._begun) - 1, news.text))
            elif isinstance(news, CallWritten):
                self._written = len(self._begun)
                self._news.append(CallEnds(len(self._begun) - 1))

    @staticmethod
    def _may_open(held: str, leads: tuple[str, ...], trigger: str) -> bool:
        """Whether a call may still open in an answer that so far is `held`: only one of `leads` (or the
        beginning of one) before the opening, blank space aside."""
        start = held.find(trigger)
        before = held[:start] if start >= 0 else held[: len(held) - _partial_opening(held, trigger)]
        lead = before.strip()
        return lead in leads if start >= 0 else any(allowed.startswith(lead) for allowed in leads)


def _partial_opening(text: str, opening: str) -> int:
    """The length of the longest end of `text` that begins `opening`."""
    for length in range(min(len(text), len(opening) - 1), 0, -1):
        if opening.startswith(text[-length:]):
            return length
    return 0
