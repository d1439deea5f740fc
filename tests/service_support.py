"""Chat services on the real bundled model, for the tests of chatapp/services."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from chatapp.documents import Document
from chatapp.engine.contract import EngineClient
from chatapp.engine.gate import Step, StepGate
from chatapp.records import MessageRecord
from chatapp.services.branches import BranchView
from chatapp.services.chat_service import ChatService
from chatapp.services.library import Library, open_library
from chatapp.services.startup import Workspace, open_workspace

# Greedy and short: reproducible answers, a fast run on two cores (one llama.cpp thread).
# No restore checks: one would compute a sampled prompt in the slot unused for longest in idle time, which the
# tiers these tests expect assume keeps its conversation (the checks have tests of their own: test_restore_checks).
SERVICE_SETTINGS = {
    "temperature": 0.0,
    "context_cap": 1024,
    "sequences": 2,
    "max_tokens": 12,
    "threads": 1,
    "cache_checks": 0,
}
# The `hold` fixture: arm the shared engine's gate for the rest of the test.
Hold = Callable[[Step, int], StepGate]


def settings(model_path: Path, **overrides: object) -> dict[str, object]:
    return {**SERVICE_SETTINGS, "model": str(model_path), **overrides}


def attach(service: ChatService, path: Path) -> tuple[BranchView, int]:
    """Attach a document on a local engine, where its size in tokens is known."""
    view, tokens = service.attach_document(path)
    assert tokens is not None, "a local engine knows a document's size in tokens"
    return view, tokens


def prefix_tokens(service: ChatService, root: MessageRecord, document: Document | None) -> int:
    """The persona and document in tokens, on a local engine."""
    tokens = service.prefix_tokens(root, document)
    assert tokens is not None, "a local engine knows a document's size in tokens"
    return tokens


def make_service(workspace: Workspace, library: Library, engine: EngineClient | None) -> ChatService:
    service = ChatService(workspace, library.conversations, library.personas, library.pins)
    if engine is not None:
        service.slot.attach(engine)
    return service


@contextmanager
def cold_service(data_dir: Path, model_path: Path, **overrides: object) -> Iterator[tuple[ChatService, Library]]:
    """A service of its own, and its library: a database in `data_dir`, an engine with one sequence and no cache."""
    workspace = open_workspace(str(data_dir), settings(model_path, **overrides))
    library = open_library(workspace)
    engine = workspace.open_engine(use_cache=False, sequences=1)
    try:
        yield make_service(workspace, library, engine), library
    finally:
        engine.close()
        library.close()
