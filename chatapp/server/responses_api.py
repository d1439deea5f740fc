"""OpenAI's Responses API: POST /v1/responses, whole or streamed with its typed events, for Codex and the
OpenAI Agents SDK's default path. Stateless: each request carries the whole conversation.

`usage.input_tokens_details.cached_tokens` says how much of the prompt the cache gave.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from chatapp.server import responses_fields as fields
from chatapp.server.answering import CLIENT_GONE, Answer, event_json, start_chat
from chatapp.server.bodies import read_request, sampling_of
from chatapp.server.reasoning_fields import responses_reasoning
from chatapp.services.completions import CompletionOutcome
from chatapp.services.streamed_answer import CallArguments, CallBegins, CallEnds
from chatapp.tools import ToolCall

router = APIRouter(prefix="/v1")


@router.post("/responses")
async def responses(request: Request) -> Response:
    context, body = await read_request(request, fields.ResponsesBody)
    context.check_model(body.model)
    sent = body.fields_sent()
    shape = fields.responses_shape(sent)
    chat = fields.api_messages(body)
    options = sampling_of(body, body.max_output_tokens)
    reasoning = responses_reasoning(sent.get("reasoning"))
    answer = await start_chat(context, body.model, chat, options, (), shape, reasoning=reasoning)
    response_id = fields.new_id("resp")
    headers = await answer.placed(request)
    if headers is None:
        return Response(status_code=CLIENT_GONE)
    if body.stream:
        events = _Events(response_id, body, sent).of(answer)
        return StreamingResponse(
            events, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"}
        )
    outcome = await answer.to_end(request)
    if outcome is None:
        return Response(status_code=CLIENT_GONE)
    output = fields.output_items(outcome, fields.new_id("msg"))
    payload = fields.response(response_id, body, sent, outcome, output)
    return JSONResponse(payload, headers=answer.final_headers(outcome))


class _Events:
    """The typed server-sent events of one streamed response, numbered in order."""

    def __init__(self, response_id: str, body: fields.ResponsesBody, sent: dict[str, Any]) -> None:
        self.response_id = response_id
        self.body = body
        self.sent = sent
        self.number = 0
        self.created_at = int(time.time())  # one moment for every event's copy of the response

    def event(self, kind: str, **payload: Any) -> str:
        data = {"type": kind, "sequence_number": self.number, **payload}
        self.number += 1
        return f"event: {kind}\ndata: {event_json(data)}\n\n"

    def whole(self, outcome: CompletionOutcome | None, output: list[Any]) -> dict[str, Any]:
        return {
            **fields.response(self.response_id, self.body, self.sent, outcome, output),
            "created_at": self.created_at,
        }

    async def of(self, answer: Answer) -> AsyncIterator[str]:
        """created, then a message item whose text streams as it comes, each call as a function_call item as it
        is written, then completed (or incomplete, cut at max_output_tokens)."""
        yield self.event("response.created", response=self.whole(None, []))
        yield self.event("response.in_progress", response=self.whole(None, []))
        message_id = fields.new_id("msg")
        text: list[str] = []  # the message's text while its item is open
        output: list[dict[str, Any]] = []
        call: ToolCall | None = None  # the call being written
        arguments: list[str] = []  # its arguments so far
        try:
            async for piece in answer.shown():
                if isinstance(piece, str):
                    if not text:
                        for opening in self._message_opened(message_id, len(output)):
                            yield opening
                    text.append(piece)
                    position = {"item_id": message_id, "output_index": len(output), "content_index": 0}
                    yield self.event("response.output_text.delta", **position, delta=piece, logprobs=[])
                    continue
                if text:
                    yield self._message_closed(message_id, "".join(text), output)
                    text = []
                if isinstance(piece, CallBegins):
                    call, arguments = ToolCall(piece.call_id, piece.name, ""), []
                    item = fields.call_item(call, "in_progress")
                    yield self.event("response.output_item.added", output_index=len(output), item=item)
                elif isinstance(piece, CallArguments) and call is not None:
                    arguments.append(piece.text)
                    position = {"item_id": f"fc_{call.id}", "output_index": len(output)}
                    yield self.event("response.function_call_arguments.delta", **position, delta=piece.text)
                elif isinstance(piece, CallEnds) and call is not None:
                    written = replace(call, arguments_json="".join(arguments))
                    for closing in self._call_closed(written, piece.complete, output):
                        yield closing
                    call = None
            outcome = answer.outcome()
        except Exception as error:  # the headers are sent: the failure goes in the stream
            failed = {**self.whole(None, output), "status": "failed"}
            failed["error"] = {
                "code": "server_error",
                "message": f"the answer failed ({type(error).__name__}: {error})",
            }
            yield self.event("response.failed", response=failed)
            return
        if text:
            yield self._message_closed(message_id, "".join(text), output)
        ended = self.whole(outcome, output)
        yield self.event(
            "response.completed" if ended["status"] == "completed" else "response.incomplete", response=ended
        )

    def _message_opened(self, message_id: str, index: int) -> list[str]:
        item = fields.message_item(message_id, "", "in_progress")
        part = fields.text_part("")
        return [
            self.event("response.output_item.added", output_index=index, item=item),
            self.event(
                "response.content_part.added", item_id=message_id, output_index=index, content_index=0, part=part
            ),
        ]

    def _message_closed(self, message_id: str, text: str, output: list[dict[str, Any]]) -> str:
        """The message item's closing events (one string: they go together); the item joins `output`."""
        position = {"item_id": message_id, "output_index": len(output), "content_index": 0}
        item = fields.message_item(message_id, text)
        events = [
            self.event("response.output_text.done", **position, text=text, logprobs=[]),
            self.event("response.content_part.done", **position, part=fields.text_part(text)),
            self.event("response.output_item.done", output_index=len(output), item=item),
        ]
        output.append(item)
        return "".join(events)

    def _call_closed(self, call: ToolCall, complete: bool, output: list[dict[str, Any]]) -> list[str]:
        """A function_call item's closing events; the item (incomplete when the answer was cut in it) joins `output`."""
        item = {**fields.call_item(call), "status": "completed" if complete else "incomplete"}
        position = {"item_id": item["id"], "output_index": len(output)}
        output.append(item)
        return [
            self.event("response.function_call_arguments.done", **position, arguments=call.arguments_json),
            self.event("response.output_item.done", output_index=position["output_index"], item=item),
        ]
