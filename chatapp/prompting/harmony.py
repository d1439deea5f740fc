"""gpt-oss's harmony answers: a run of messages on channels, read as they stream.

After the generation prompt `<|start|>assistant` the model writes messages, each a header, then
`<|message|>` and a body:

- `<|channel|>analysis<|message|>...<|end|>`: its reasoning, not for the user;
- `<|channel|>commentary<|message|>...<|end|>`: a preamble the user may see (before calls);
- `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`: a call, ended by
  `<|call|>`; the recipient may also stand in the role's header, as the template writes past
  calls (` to=functions.NAME<|channel|>commentary json<|message|>{...}`);
- `<|channel|>final<|message|>...`: the reply, ended by `<|return|>`.

A later message begins with `<|start|>assistant`. `<|call|>` and `<|return|>` end generation, so
they are not in the answer's text; llama.cpp renders the other markers as text (it makes them
user-defined tokens), so the text holds them. What the user sees is the preambles' and the
reply's text, joined as llama-server joins them; the reasoning goes nowhere (the API answers
have no reasoning field yet), but stays in the history as generated, in the answer's own ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
START = "<|start|>"
END = "<|end|>"
CONSTRAIN = "<|constrain|>"
RETURN = "<|return|>"
CALL_END = "<|call|>"
FUNCTIONS = "functions."
NEXT_MESSAGE = START + "assistant"
BODY_ENDS = (END, CALL_END, RETURN)
OPENINGS = (CHANNEL, " to=")  # how an answer in harmony begins: a channel, or a recipient in the role's header
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"([A-Za-z]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


def speaks_harmony(template_source: str) -> bool:
    """Whether a chat template writes harmony (gpt-oss's): channels, and calls ended by `<|call|>`."""
    return CHANNEL in template_source and CALL_END in template_source


def as_in_inference(rendered: str) -> str:
    """A history as the model reads it: the template ends its last answer with `<|return|>`, as in
    training; in inference an earlier answer ends with `<|end|>`, as every answer before it does.

    Without this the text of an answer changes when a message follows it, and the builder could not
    append to the prompt.
    """
    if rendered.endswith(RETURN):
        return rendered[: -len(RETURN)] + END
    return rendered


@dataclass(frozen=True)
class HarmonyCall:
    """A message addressed to a function: its name and its body (the arguments), as written."""

    name: str
    body: str
    closed: bool  # False: the answer ended inside it (a length limit)


class HarmonyReader:
    """Reads an answer piece by piece: `feed` gives the text the user may see as soon as it is
    sure, `finish` what is left; the calls are kept in `calls`.

    A whole answer read at once gives the same text as the same answer fed in any pieces (what a
    stream shows joins to the whole answer's content). An answer that does not begin as harmony
    does is plain text, all shown.
    """

    def __init__(self) -> None:
        self.calls: list[HarmonyCall] = []
        self._pending = ""  # text not read yet: a header, or what may begin a marker
        self._searched = 0  # how much of a pending header is known to hold no `<|message|>`
        self._state = "opening"  # opening, plain, header, body
        self._shown = False  # the body being read is for the user
        self._call: str | None = None  # the body being read is a call to this function
        self._call_body: list[str] = []

    def feed(self, piece: str) -> str:
        """The text to show now from `piece` and what was held before it."""
        self._pending += piece
        shown: list[str] = []
        while self._step(shown):
            pass
        return "".join(shown)

    def finish(self) -> str:
        """What is left to show once the answer ended (a plain answer's start, a body's last characters)."""
        rest, self._pending = self._pending, ""
        if self._state in ("opening", "plain"):
            return rest
        if self._state == "body":
            self._take_body(rest, closed=False)
            return rest if self._shown else ""
        return ""  # a header the answer ended in

    def _step(self, shown: list[str]) -> bool:
        """Read what can be read of the pending text; whether to go on."""
        pending = self._pending
        if self._state == "opening":
            if pending.startswith(OPENINGS):
                self._state = "header"
            elif any(opening.startswith(pending) for opening in OPENINGS):
                return False  # not known yet
            else:
                self._state = "plain"
            return True
        if self._state == "plain":
            shown.append(pending)
            self._pending = ""
            return False
        if self._state == "header":
            return self._read_header(pending)
        return self._read_body(pending, shown)

    def _read_header(self, pending: str) -> bool:
        at = pending.find(MESSAGE, max(0, self._searched - len(MESSAGE) + 1))
        if at < 0:
            self._searched = len(pending)  # a header that never ends is not searched again at every piece
            return False
        self._searched = 0
        header = pending[:at]
        channels = _CHANNEL_NAME.findall(header)
        recipient = _RECIPIENT.search(header)
        channel = channels[-1] if channels else ""
        self._shown = channel == "final" or (channel == "commentary" and recipient is None)
        target = recipient.group(1) if recipient else ""
        self._call = target.removeprefix(FUNCTIONS) if target.startswith(FUNCTIONS) else None
        self._call_body = []
        self._pending = pending[at + len(MESSAGE) :]
        self._state = "body"
        return True

    def _read_body(self, pending: str, shown: list[str]) -> bool:
        ends = [(at, marker) for marker in BODY_ENDS if (at := pending.find(marker)) >= 0]
        if ends:
            at, marker = min(ends)
            body, self._pending = pending[:at], pending[at + len(marker) :]
            self._take_body(body, closed=True)
            self._state = "header"
        else:
            held = _partial_marker(pending)
            body, self._pending = pending[: len(pending) - held], pending[len(pending) - held :]
            self._take_body(body, closed=None)
        if self._shown:
            shown.append(body)
        return bool(ends)

    def _take_body(self, body: str, *, closed: bool | None) -> None:
        """Keep a call's body; `closed` None: more of it may follow."""
        if self._call is None:
            return
        self._call_body.append(body)
        if closed is not None:
            self.calls.append(HarmonyCall(self._call, "".join(self._call_body), closed))
            self._call = None


def _partial_marker(text: str) -> int:
    """The length of the longest end of `text` that begins a body's end marker."""
    for length in range(min(len(text), max(map(len, BODY_ENDS)) - 1), 0, -1):
        if any(marker.startswith(text[-length:]) for marker in BODY_ENDS):
            return length
    return 0
