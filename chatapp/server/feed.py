"""A completion's events, read on a thread of their own and handed to the event loop.

The engine's events come from a blocking queue. One thread per request reads them all, to
the end, and passes each to the loop; the handler awaits them. When the client goes away
the handler cancels the completion and stops listening: the thread still reads to the end
(quickly, since the engine stops at its next step), so the request's slot is always given
back and nothing is left half-read.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from chatapp.services.completions import Completion
from chatapp.services.streams import StreamEvent


@dataclass(frozen=True)
class _End:
    error: BaseException | None


class CompletionFeed:
    """`async for event in feed` yields the completion's events; `close()` cancels what is left."""

    def __init__(self, completion: Completion) -> None:
        self.completion = completion
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[StreamEvent | _End] = asyncio.Queue()
        self._thread = threading.Thread(target=self._pump, name="chatapp-api-feed", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        end = _End(None)
        try:
            for event in self.completion.events():
                self._hand_over(event)
        except BaseException as error:  # handed to the handler, which answers with it
            end = _End(error)
        self._hand_over(end)

    def _hand_over(self, item: StreamEvent | _End) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: the server is shutting down
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        while True:
            item = await self._queue.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item

    def close(self) -> None:
        """The client left (or the handler failed): stop the completion if it still runs."""
        if not self.completion.done:
            self.completion.cancel()
