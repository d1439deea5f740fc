"""The model a chat answers with: attached once loaded, another prepared beside it and switched to, the old
one retired (its cache written while the new one answers), all closed once.

Threads: loading and retiring run on workers while the screen reads the slot, so the engine, its
prewarmer and the prompt log are swapped together under one lock and read together (`running`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from chatapp.engine.contract import EngineClient
from chatapp.errors import ChatappError
from chatapp.prompting.prompt import PromptBuilder
from chatapp.services.answer_shape import AnswerShape, speaks_harmony
from chatapp.services.answer_start import AnswerStart
from chatapp.services.startup import Workspace
from chatapp.services.streamed_answer import StreamedContent
from chatapp.services.warmup import Prewarmer

NOT_LOADED = "the model is not loaded (still loading, or closing); try again in a moment"


class EngineSlot:
    """One engine at a time, with what is bound to it: its prewarmer and the log of its prompts."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace  # the settings and the model answering (another after a switch)
        self.engine: EngineClient | None = None
        self.prewarmer: Prewarmer | None = None
        self.answers: AnswerStart | None = None  # answers start here: the prewarmer told, the prompts logged
        self._lock = threading.Lock()  # attach and close may come from different threads
        self._closed = False
        self._prepared: tuple[EngineClient, Path, threading.Event | None] | None = None  # loaded for a switch
        self._retired: list[EngineClient] = []  # models switched away from, not closed yet

    def attach(self, engine: EngineClient) -> None:
        """Answer with `engine` (the first one loaded); closed at once if the slot was closed meanwhile."""
        with self._lock:
            if self._closed:
                engine.close()
                return
            if self.engine is not None:
                raise RuntimeError("a model is already attached to this chat service")
            self._bind(engine)

    def prepare(
        self, path: Path, progress: Callable[[float], bool] | None = None, cancelled: threading.Event | None = None
    ) -> None:
        """Load another model as the settings load one (slow: off the UI thread) while the one attached
        keeps answering; `switch_to_prepared` then answers with it. `progress` hears the share loaded;
        False from it cancels (LoadCancelled). `cancelled` names this switch: a later one's model, or
        one cancelled meanwhile, is never taken for it."""
        engine = self.workspace.with_model(path).open_engine(load_progress=progress)
        with self._lock:
            if self._closed or (cancelled is not None and cancelled.is_set()):
                dropped: EngineClient | None = engine
            else:
                dropped = self._prepared[0] if self._prepared is not None else None
                self._prepared = (engine, path, cancelled)
        if dropped is not None:
            dropped.close()

    def drop_prepared(self, cancelled: threading.Event | None = None) -> None:
        """Close a model loaded for a switch that will not happen (only that switch's, when named)."""
        with self._lock:
            prepared = self._prepared
            if prepared is None or (cancelled is not None and prepared[2] is not cancelled):
                return
            self._prepared = None
        prepared[0].close()

    def switch_to_prepared(self, cancelled: threading.Event | None = None) -> Path:
        """Answer with the prepared model from now on; returns its file. The old one is set aside for
        `close_retired` (writing its cache takes a while: the new model answers meanwhile)."""
        with self._lock:
            prepared = self._prepared
            if prepared is None or self._closed or (cancelled is not None and prepared[2] is not cancelled):
                raise ChatappError("no model is ready to switch to")
            self._prepared = None
            engine, path, _switch = prepared
            if self.engine is not None:
                self._retired.append(self.engine)
            self._bind(engine)
            self.workspace = self.workspace.with_model(path)
        return path

    def close_retired(self) -> None:
        """Write the caches of the models switched away from and close them (off the UI thread)."""
        with self._lock:
            retired, self._retired = self._retired, []
        for engine in retired:
            try:
                engine.flush_cache()  # its last answers' prefixes: there when the user comes back to it
            finally:
                engine.close()

    def close(self) -> None:
        """Free every model the slot holds; one attached later is closed at once."""
        with self._lock:
            self._closed = True
            engine, self.engine, self.prewarmer, self.answers = self.engine, None, None, None
        self.drop_prepared()
        self.close_retired()
        if engine is not None:
            engine.close()

    def running(self) -> tuple[EngineClient, Prewarmer]:
        """The engine and its prewarmer, read together (a worker thread may race `close`); ChatappError
        while none is loaded."""
        with self._lock:
            engine, prewarmer = self.engine, self.prewarmer
        if engine is None or prewarmer is None:
            raise ChatappError(NOT_LOADED)
        return engine, prewarmer

    def answer_start(self) -> AnswerStart:
        """Where the running engine's answers start; ChatappError while none is loaded."""
        answers = self.answers
        if answers is None:
            raise ChatappError(NOT_LOADED)
        return answers

    @property
    def ready(self) -> bool:
        return self.engine is not None

    def model_path(self) -> Path | None:
        """The file of the model answering (None on a backend server, or before one is loaded)."""
        engine = self.engine
        return engine.info.path if engine is not None else None

    def model_label(self) -> str:
        """The loaded model's file name, for the status line."""
        engine = self.engine
        return engine.info.short_name if engine is not None else "no model"

    def offload_device(self) -> str:
        """The device the model's offloaded layers run on, short ("Vulkan0", "CUDA0"); "" when none are."""
        engine = self.engine
        if engine is None or engine.info.gpu_layers <= 0:
            return ""
        return engine.info.device.split(":")[0]

    def flash_attention(self) -> bool:
        """Whether the loaded model runs with flash attention (as set, or as measured faster: flash_choice.py)."""
        engine = self.engine
        return engine is not None and engine.info.flash_attention

    def context_size(self) -> int | None:
        """Tokens one conversation's context holds (None until the model is loaded)."""
        engine = self.engine
        return engine.info.n_ctx_per_sequence if engine is not None else None

    def take_cache_notice(self) -> str | None:
        """A problem of the cache's disk tier not yet told (disk full, read-only, repaired), once."""
        engine = self.engine
        cache = engine.cache if engine is not None else None
        return cache.take_notice() if cache is not None else None

    def answer_display(self) -> StreamedContent:
        """What a screen shows of an answer as it streams: a gpt-oss answer's reply, not its reasoning
        (its pieces join to what a saved answer shows); any other answer as it comes."""
        return StreamedContent(AnswerShape(), self.display_builder())

    def hides_reasoning(self) -> bool:
        """Whether the model answering shows less of an answer than it saves (gpt-oss: no reasoning)."""
        return speaks_harmony(self.display_builder())

    def display_builder(self) -> PromptBuilder | None:
        """The prompt builder of the model answering (None before one is loaded, or where a server builds)."""
        engine = self.engine
        return engine.prompt_builder if engine is not None else None

    def _bind(self, engine: EngineClient) -> None:
        self.engine = engine
        self.prewarmer = Prewarmer(engine)
        self.answers = AnswerStart(engine, self.prewarmer)
