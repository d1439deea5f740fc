"""Building prompts that only ever grow: the tokens of turn k+1 begin with turn k's.

Rendering the whole conversation and tokenizing it again would let the tokenizer split the
text differently from what the model generated, and every such change invalidates the KV
cache from that point on. Instead each message becomes tokens on its own:

- its text segment is what the model's own template adds for it (the render of the
  history plus the message, minus the render of the history);
- the template's own text in that segment is tokenized with special tokens parsed, the
  user's content without (so typed `<|im_end|>` stays text), each content part apart
  (a document's tokens do not depend on the question after it);
- an assistant message the model wrote contributes the generation header it was
  generated after, its exact generated token ids, and the template's closing text.

A message's tokens depend only on the messages before it, so a prompt is a pure function
of the conversation, and appending a message appends tokens.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, replace
from typing import Any, Protocol

from chatapp.prompting.chat_template import FALLBACK_CHATML, ChatTemplate, TemplateRenderError
from chatapp.prompting.harmony import CALL_END, CHANNEL, HarmonyReader, as_in_inference, speaks_harmony
from chatapp.prompting.memo import BoundedMemo
from chatapp.prompting.tool_blocks import HERMES
from chatapp.prompting.tool_detection import PROBE_TOOL, native_format
from chatapp.prompting.tool_formats import ToolFormat
from chatapp.reasoning import Reasoning
from chatapp.tools import ToolCall, ToolResult, ToolSpec
from chatapp.vocabulary import Role

log = logging.getLogger(__name__)

# Remembered tokenizations: histories (by their messages) and long content parts (documents).
MEMO_ENTRIES = 16
LONG_TEXT_CHARACTERS = 2000
# Stands in for a message's content to find where the template puts it.
CONTENT_SENTINEL = "\x00chatapp-content\x00"
TOOL_BUILDERS = 8  # builders kept for the tool sets seen last (agents send the same tools every time)


@dataclass(frozen=True)
class ChatMessage:
    """One message. `parts` are tokenized separately; `generated_ids` are the model's own tokens.

    An assistant message may hold the `tool_calls` it made; a TOOL message holds the `results`
    of consecutive calls, since templates render a run of results together.
    """

    role: Role
    parts: tuple[str, ...]
    generated_ids: tuple[int, ...] | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    results: tuple[ToolResult, ...] = ()

    @classmethod
    def of(cls, role: Role, *parts: str) -> ChatMessage:
        return cls(role=role, parts=tuple(parts))

    @property
    def content(self) -> str:
        return "".join(self.parts)

    @property
    def known_ids(self) -> tuple[int, ...] | None:
        """The generated ids to use: none for a text means the engine could not vouch for them (a chat API,
        ids that did not spell the answer), so the text is tokenized rather than the answer left out."""
        if self.generated_ids is not None and not self.generated_ids and self.content:
            return None
        return self.generated_ids

    def template_inputs(self) -> list[dict[str, Any]]:
        """The template's messages for this one (a TOOL message: one per result)."""
        if self.role is Role.TOOL:
            return [result.template_input(result.content) for result in self.results]
        message: dict[str, Any] = {"role": self.role.value, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.template_input() for call in self.tool_calls]
        return [message]


class Tokenizer(Protocol):
    """What the builder needs from a model's vocabulary."""

    add_bos: bool
    bos_id: int

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...


class ModelVocabulary(Tokenizer, Protocol):
    """A loaded GGUF file's vocabulary with its chat template (a remote engine builds its template from /props)."""

    bos_id: int
    eos_id: int

    def chat_template(self) -> str | None: ...

    def token_text(self, token: int) -> str: ...


class PromptBuilder:
    """Turns a list of messages into prompt tokens with the model's own chat template."""

    @classmethod
    def for_model(cls, vocabulary: ModelVocabulary) -> PromptBuilder:
        """The model's own chat template (ChatML when it has none) over its own vocabulary."""
        template = ChatTemplate(
            source=vocabulary.chat_template() or FALLBACK_CHATML,
            bos_token=vocabulary.token_text(vocabulary.bos_id),
            eos_token=vocabulary.token_text(vocabulary.eos_id),
        )
        return cls(template, vocabulary)

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, tools: tuple[ToolSpec, ...] = ()) -> None:
        self.template = template
        self.tokenizer = tokenizer
        self.tools = tools  # offered to the model in every prompt this builder makes
        self._history_memo: BoundedMemo[tuple[ChatMessage, ...], tuple[int, ...]] = BoundedMemo(MEMO_ENTRIES)
        self._text_memo: BoundedMemo[str, tuple[int, ...]] = BoundedMemo(MEMO_ENTRIES)
        self._tool_builders: BoundedMemo[tuple[ToolSpec, ...], PromptBuilder] = BoundedMemo(TOOL_BUILDERS)
        self._reasoning_builders: BoundedMemo[tuple[tuple[str, Any], ...], PromptBuilder] = BoundedMemo(TOOL_BUILDERS)
        self._harmony = speaks_harmony(template.source)  # gpt-oss's: an answer's end depends on what follows it
        self.supports_system = self._accepts_system_messages()
        native = native_format(template.source, self._renders_tools() and self._renders_a_tool_conversation())
        self.native_tools = native is not None
        self.tool_format: ToolFormat = native or HERMES

    def with_tools(self, tools: tuple[ToolSpec, ...]) -> PromptBuilder:
        """A builder whose prompts offer `tools` (in the template's own way, or taught in the system prompt)."""
        if tools == self.tools:
            return self
        return self._tool_builders.get_or_make(tools, lambda: self._derived(tools=tools))

    def with_reasoning(self, reasoning: Reasoning | None) -> PromptBuilder:
        """A builder whose template is told how much to reason (None: the template's default). Only the
        variables the template reads are set, so a model without a switch keeps this very builder."""
        if reasoning is None:
            return self
        variables = tuple((name, value) for name, value in reasoning.template_variables() if self.template.reads(name))
        if not variables or variables == self.template.variables:
            return self
        return self._reasoning_builders.get_or_make(
            variables, lambda: self._derived(template=self.template.with_variables(variables))
        )

    def _derived(
        self, *, tools: tuple[ToolSpec, ...] | None = None, template: ChatTemplate | None = None
    ) -> PromptBuilder:
        """A builder like this one offering other `tools` or with another `template`: what was learnt of the
        template and the tokenized long texts (documents) are shared, the histories' tokens are its own (the
        tools and the template's variables change them)."""
        derived = copy.copy(self)
        derived.tools = self.tools if tools is None else tools
        derived.template = self.template if template is None else template
        derived._history_memo = BoundedMemo(MEMO_ENTRIES)
        derived._tool_builders = BoundedMemo(TOOL_BUILDERS)
        derived._reasoning_builders = BoundedMemo(TOOL_BUILDERS)
        return derived

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """The model's tokens for `text` (what /tokenize and a text completion send the model)."""
        return self.tokenizer.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        return self.tokenizer.detokenize(tokens)

    def close(self) -> None:
        """Free the vocabulary when it has something to free (a model loaded for this builder alone)."""
        close = getattr(self.tokenizer, "close", None)
        if callable(close):
            close()

    def build(
        self, messages: list[ChatMessage], *, add_generation_prompt: bool = True, remember: bool = True
    ) -> list[int]:
        """The prompt tokens for `messages`, ending with the assistant header when asked.

        `remember=False` keeps the tokens out of the memo (a one-off look at a conversation's prefix).
        """
        messages = self._prepared(messages)
        tokens = self._history_tokens(messages, remember) if messages else []
        if add_generation_prompt:
            tokens += self._template_tokens(self.generation_header_text(messages))
        return self._with_bos(tokens)

    def draft_tokens(self, messages: list[ChatMessage], draft: ChatMessage) -> list[int]:
        """The prompt for `messages + [draft]` up to the end of the draft's content.

        For warming the KV cache while the user types: no closing text, no generation header.
        With the draft's last part empty, this is a prefix of `build(messages + [sent])` for any
        sent message with the same earlier parts and some non-blank text (the parts are
        tokenized apart, and the content is shown as the template shows it when more follows,
        e.g. trimmed at the start only). With a non-empty last part only all but the last
        token is expected to stay (the tokenizer may merge it with what is typed next).
        """
        folded = self._prepared([*messages, draft])
        history, last = folded[:-1], folded[-1]
        return self._with_bos(self._history_tokens(history) + self._open_message_tokens(history, last))

    def message_tokens(self, history: list[ChatMessage], message: ChatMessage) -> list[int]:
        """The tokens `message` adds after `history` (BOS aside)."""
        before = self._render_history(history)
        if message.results:
            return self._results_tokens(before, history, message)
        # Known ids spell the calls too: the probe finds the closing text after plain content.
        sentinel_segment = self._segment(
            before, history, replace(message, parts=(CONTENT_SENTINEL,), generated_ids=None, tool_calls=())
        )
        prefix, sentinel, suffix = sentinel_segment.partition(CONTENT_SENTINEL)
        found = bool(sentinel) and CONTENT_SENTINEL not in suffix
        ids = message.known_ids
        if ids is not None:
            closing = suffix if found else ""
            if self._harmony and message.tool_calls:
                closing = CALL_END  # the template ends a call with it (the model's stop token), not as an answer
            return (
                self._template_tokens(self.generation_header_text(history)) + list(ids) + self._template_tokens(closing)
            )
        actual_segment = self._segment(before, history, message)
        if found and actual_segment == prefix + message.content + suffix:
            content_tokens = [token for part in message.parts for token in self._content_tokens(part)]
            return self._template_tokens(prefix) + content_tokens + self._template_tokens(suffix)
        if found and actual_segment.startswith(prefix) and actual_segment.endswith(suffix):
            # The template changed the content (trimmed it, say): keep its version, still
            # part by part when it is a slice of the content, so a draft of it stays a prefix.
            middle = actual_segment[len(prefix) : len(actual_segment) - len(suffix)]
            start = message.content.find(middle)
            if start < 0:
                content_tokens = self._content_tokens(middle)
            else:
                content_tokens = self._parts_tokens(message.parts, start, start + len(middle))
            return self._template_tokens(prefix) + content_tokens + self._template_tokens(suffix)
        return self._template_tokens(actual_segment)

    def _open_message_tokens(self, history: list[ChatMessage], message: ChatMessage) -> list[int]:
        """`message`'s header and content as they will be once more text follows it (no closing)."""
        if message.known_ids is not None:
            return self.message_tokens(history, message)  # an answer is complete: nothing to draft
        before = self._render_history(history)
        probe = self._segment(before, history, replace(message, parts=(CONTENT_SENTINEL,)))
        prefix, found, suffix = probe.partition(CONTENT_SENTINEL)
        if not found or CONTENT_SENTINEL in suffix:
            return []  # where the content goes is unknown: warm nothing of this message
        # The content followed by more text: a template that trims shows its start trimmed only.
        opened = self._segment(before, history, replace(message, parts=(*message.parts, CONTENT_SENTINEL)))
        head, found, _ = opened.partition(CONTENT_SENTINEL)
        content = message.content
        if not found or not head.startswith(prefix) or not content.endswith(head[len(prefix) :]):
            return self._template_tokens(prefix)
        start = len(content) - (len(head) - len(prefix))
        return self._template_tokens(prefix) + self._parts_tokens(message.parts, start, len(content))

    def generation_header_text(self, history: list[ChatMessage]) -> str:
        """What the template appends to `history` to ask for an assistant answer."""
        without = self._render_history(history)
        with_header = self._render(history, add_generation_prompt=True)
        if with_header.startswith(without):
            return with_header[len(without) :]
        log.warning("chat template's generation prompt does not extend the history; using the assistant prefix")
        probe = self._segment(without, history, ChatMessage.of(Role.ASSISTANT, CONTENT_SENTINEL))
        return probe.partition(CONTENT_SENTINEL)[0]

    def _accepts_system_messages(self) -> bool:
        """Some templates (Gemma's, Mistral's) refuse a system role; Mistral Nemo's shows it in the latest
        question only, which would change every earlier prompt. Either way the persona goes in the first question."""
        persona, question = "chatapp-persona", "chatapp-question"
        probe = [
            {"role": Role.SYSTEM.value, "content": persona},
            {"role": Role.USER.value, "content": question},
            {"role": Role.ASSISTANT.value, "content": "a"},
            {"role": Role.USER.value, "content": "u"},
        ]
        try:
            rendered = self.template.render(probe, add_generation_prompt=True)
        except TemplateRenderError:
            return False
        return -1 < rendered.find(persona) < rendered.find(question)

    def _renders_tools(self) -> bool:
        """Whether the template shows the model the tools it is given (many have no tools at all)."""
        probe = [{"role": Role.USER.value, "content": "u"}]
        try:
            rendered = self.template.render(probe, add_generation_prompt=True, tools=[PROBE_TOOL.template_input()])
        except TemplateRenderError:
            return False
        return PROBE_TOOL.name in rendered

    def _renders_a_tool_conversation(self) -> bool:
        """Whether the template renders each step of a tool conversation as this builder renders them
        (a call, its result); some refuse a step, and then the format is taught instead. A system
        message alone may be refused (Llama 3.1's puts the tools in the first user message): the
        builder prints it with the first question."""
        tools = [PROBE_TOOL.template_input()]
        call = ToolCall("probecall", PROBE_TOOL.name, "{}")
        steps = [
            ChatMessage.of(Role.USER, "u"),
            ChatMessage(Role.ASSISTANT, ("",), tool_calls=(call,)),
            ChatMessage(Role.TOOL, (), results=(ToolResult(call.id, call.name, "r"),)),
        ]
        for conversation in ([ChatMessage.of(Role.SYSTEM, "s"), *steps], steps):
            for count in range(1, len(conversation) + 1):
                inputs = [item for message in conversation[:count] for item in message.template_inputs()]
                try:
                    self.template.render(inputs, add_generation_prompt=False, tools=tools)
                except TemplateRenderError:
                    if not all(message.role is Role.SYSTEM for message in conversation[:count]):
                        return False
        return True

    def _prepared(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """The messages the template is given: tools taught in the system prompt if it has none; system folded."""
        if not self.native_tools:
            messages = self._tools_as_text(messages)
        elif self._harmony:
            messages = [_as_harmony_templates_take(message) for message in messages]
        return self._fold_system_messages(messages)

    def _tools_as_text(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """For a template without tools: the format taught after the persona, calls and results written out."""
        form = HERMES  # the format taught (tool_format is HERMES here too)
        written = []
        for message in messages:
            if message.role is Role.TOOL:
                message = ChatMessage(Role.USER, (form.results_text(message.results),))
            elif message.tool_calls:
                calls = "\n".join(form.call_text(call) for call in message.tool_calls)
                lead = message.content + "\n" if message.content else ""
                message = replace(message, parts=(lead + calls,), tool_calls=())
            written.append(message)
        if not self.tools:
            return written
        teaching = form.instructions(self.tools)
        if written and written[0].role is Role.SYSTEM:
            persona = written[0]  # a part of its own: the persona's tokens stay those of a request without tools
            return [replace(persona, parts=(*persona.parts, "\n\n" + teaching)), *written[1:]]
        return [ChatMessage.of(Role.SYSTEM, teaching), *written]

    def _fold_system_messages(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """Without a system role, the persona becomes the first part of the first user message."""
        if self.supports_system or not messages or messages[0].role != Role.SYSTEM:
            return messages
        persona, rest = messages[0], messages[1:]
        if rest and rest[0].role == Role.USER:
            first = rest[0]
            return [replace(first, parts=(persona.content + "\n\n", *first.parts)), *rest[1:]]
        return [ChatMessage.of(Role.USER, persona.content), *rest]

    def _render_history(self, history: list[ChatMessage]) -> str:
        if not history and self.tools and self.native_tools:
            return ""  # what a template prints for tools alone it prints inside the first message
        try:
            return self._render(history, add_generation_prompt=False)
        except TemplateRenderError:
            if history and not self._may_wait_for_a_question(history):
                raise
            return ""  # Some templates index messages[0] and cannot render nothing.

    def _may_wait_for_a_question(self, messages: list[ChatMessage]) -> bool:
        """Whether a template refusing `messages` may be one that prints the system message only with
        the first question (Llama 3.1's puts the tools there): that text then comes with the question."""
        return bool(self.tools) and self.native_tools and all(message.role is Role.SYSTEM for message in messages)

    def _segment(self, before: str, history: list[ChatMessage], message: ChatMessage) -> str:
        """The text the template adds for `message` after `history` (rendered as `before`)."""
        try:
            after = self._render([*history, message], add_generation_prompt=False)
        except TemplateRenderError:
            if not self._may_wait_for_a_question([*history, message]):
                raise
            return ""  # printed with the first question
        if after.startswith(before):
            return after[len(before) :]
        # The template rewrites earlier text when a message is added; the prompt must not
        # change behind us, so render the message on its own instead.
        log.warning("chat template is not prefix-stable for a %s message; rendering it alone", message.role)
        alone = self._render([message], add_generation_prompt=False, with_tools=False)  # tools come once, first
        try:
            empty = self.template.render([], add_generation_prompt=False)
        except TemplateRenderError:
            empty = self.template.bos_token  # what a template that cannot render nothing (Nemo's) prints first
        return alone[len(empty) :] if alone.startswith(empty) else alone

    def _render(self, messages: list[ChatMessage], *, add_generation_prompt: bool, with_tools: bool = True) -> str:
        inputs = [item for message in messages for item in self._with_template_ids(message).template_inputs()]
        if with_tools and self.tools and self.native_tools:
            tools = [tool.template_input() for tool in self.tools]
            text = self.template.render(inputs, add_generation_prompt=add_generation_prompt, tools=tools)
        else:
            text = self.template.render(inputs, add_generation_prompt=add_generation_prompt)
        return as_in_inference(text) if self._harmony and not add_generation_prompt else text

    def _with_template_ids(self, message: ChatMessage) -> ChatMessage:
        """`message` with its calls' ids as the template takes them (Mistral's refuse all but nine letters
        and digits; CallIds.for_template), the same for a call and for its result."""
        ids = self.tool_format.call_ids
        if ids.length is None or not (message.tool_calls or message.results):
            return message
        return replace(
            message,
            tool_calls=tuple(replace(call, id=ids.for_template(call.id)) for call in message.tool_calls),
            results=tuple(replace(result, call_id=ids.for_template(result.call_id)) for result in message.results),
        )

    def _results_tokens(self, before: str, history: list[ChatMessage], message: ChatMessage) -> list[int]:
        """Tool results as the template writes them: its own text parsed for special tokens, each result's not.

        Markers stand in for the results to find the template's text around them (printable, so
        a template that prints results through `tojson` keeps them); what stands between those
        texts in the real render is the result as shown, tokenized as text: a tool's output never
        becomes a special token.
        """
        marks = [f"\ue000chatapp-result-{index}\ue001" for index in range(len(message.results))]
        probe = replace(
            message,
            results=tuple(replace(result, content=mark) for result, mark in zip(message.results, marks, strict=True)),
        )
        heads: list[str] = []
        rest = self._segment(before, history, probe)
        for mark in marks:
            head, found, rest = rest.partition(mark)
            if not found:
                return self._content_tokens(self._segment(before, history, message))  # as text: never injected
            heads.append(head)
        actual = self._segment(before, history, message)
        tokens: list[int] = []
        at = 0
        for index, head in enumerate(heads):
            last = index + 1 == len(heads)
            following = rest if last else heads[index + 1]
            if not actual.startswith(head, at):
                return self._content_tokens(actual)
            at += len(head)
            # The last result runs to the template's closing text: a result may hold that text itself.
            end = len(actual) - len(rest) if last and actual.endswith(rest) else actual.find(following, at)
            if end < at:
                return self._content_tokens(actual)
            tokens += self._template_tokens(head) + self._content_tokens(actual[at:end])
            at = end
        if actual[at:] != rest:
            return self._content_tokens(actual)
        return tokens + self._template_tokens(rest)

    def _history_tokens(self, messages: list[ChatMessage], remember: bool = True) -> list[int]:
        """What the template prints before any message (often the BOS text), then each message.

        A message's tokens depend only on the messages before it, so the tokens of a history
        seen before are remembered: type-ahead rebuilds the same history at every word, and a
        new turn only adds its own messages.
        """
        start, tokens = 0, None
        for length in range(len(messages), 0, -1):
            known = self._history_memo.get(tuple(messages[:length]))
            if known is not None:
                start, tokens = length, list(known)
                break
        if tokens is None:
            tokens = self._template_tokens(self._render_history([]))
        for index in range(start, len(messages)):
            tokens += self.message_tokens(messages[:index], messages[index])
        if messages and remember:
            self._history_memo.put(tuple(messages), tuple(tokens))
        return tokens

    def _with_bos(self, tokens: list[int]) -> list[int]:
        if self.tokenizer.add_bos and (not tokens or tokens[0] != self.tokenizer.bos_id):
            tokens.insert(0, self.tokenizer.bos_id)
        return tokens

    def _parts_tokens(self, parts: tuple[str, ...], start: int, end: int) -> list[int]:
        """The content characters [start, end) tokenized part by part."""
        tokens: list[int] = []
        offset = 0
        for part in parts:
            piece = part[max(start - offset, 0) : max(end - offset, 0)]
            tokens += self._content_tokens(piece)
            offset += len(part)
        return tokens

    def _template_tokens(self, text: str) -> list[int]:
        return self.tokenizer.tokenize(text, add_special=False, parse_special=True) if text else []

    def _content_tokens(self, text: str) -> list[int]:
        if len(text) < LONG_TEXT_CHARACTERS:
            return self.tokenizer.tokenize(text, add_special=False, parse_special=False) if text else []
        known = self._text_memo.get(text)  # a document, tokenized again at every typed word otherwise
        if known is None:
            known = tuple(self.tokenizer.tokenize(text, add_special=False, parse_special=False))
            self._text_memo.put(text, known)
        return list(known)


def _as_harmony_templates_take(message: ChatMessage) -> ChatMessage:
    """An answer as a harmony template takes it; its ids, when known, keep what it said.

    A call goes without its text (a preamble), which the template would show as reasoning and drop
    once an answer follows, rewriting the history. An answer kept as generated, channels and all
    (the chat screen keeps it so), goes as its reply: the template refuses channel markers in content.
    """
    if message.role is not Role.ASSISTANT or not message.content:
        return message
    if message.tool_calls:
        return replace(message, parts=("",), generated_ids=message.known_ids)
    if CHANNEL in message.content:
        reader = HarmonyReader()
        reply = reader.feed(message.content) + reader.finish()
        return replace(message, parts=(reply,), generated_ids=message.known_ids)
    return message
