"""CacheService on the real bundled model: pinning a persona's or a document's prefix,
unpinning, pruning, clearing, and the overview with and without a running engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache.keys import as_token_array
from chatapp.engine.contract import EngineClient
from chatapp.engine.engine import Engine
from chatapp.errors import ChatappError
from chatapp.prompting.prompt import ChatMessage
from chatapp.services.branches import as_document
from chatapp.services.cache_view import CacheService
from chatapp.services.chat_service import ChatService
from chatapp.services.library import Library
from chatapp.services.prompt_plan import builder_of
from chatapp.services.startup import Workspace
from chatapp.vocabulary import Role
from tests.service_support import make_service

PERSONA_NAME = "Concise assistant"


@pytest.fixture
def chat(workspace: Workspace, library: Library, shared_engine: Engine) -> ChatService:
    assert shared_engine.cache is not None
    shared_engine.cache.clear()  # each test starts with empty RAM and disk tiers
    return make_service(workspace, library, shared_engine)


def pinned_entries(engine: EngineClient) -> int:
    assert engine.cache is not None
    return int(engine.cache.stats()["pinned_entries"])


def test_pin_persona_stores_and_pins_its_prefix_and_unpin_releases_it(chat: ChatService, library: Library) -> None:
    engine = chat.slot.engine
    assert engine is not None
    assert engine.cache is not None
    cache_view = CacheService(chat)
    persona = library.personas.get_by_name(PERSONA_NAME)
    assert pinned_entries(engine) == 0
    count = cache_view.pin_persona(persona)
    assert count > 0
    assert pinned_entries(engine) == count
    pins = library.pins.list()
    assert [(pin.kind, pin.label) for pin in pins] == [("persona", PERSONA_NAME)]
    expected = builder_of(engine).build([ChatMessage.of(Role.SYSTEM, persona.prompt)], add_generation_prompt=False)
    assert list(pins[0].tokens) == expected
    # The pinned blocks cover the whole prefix: a lookup finds all of it.
    assert engine.cache.lookup(as_token_array(expected)).tokens == len(expected)
    overview = cache_view.overview()
    assert overview.live
    assert overview.pins == pins
    assert overview.problem is None
    assert overview.stats["pinned_entries"] == count

    # Pinning the same persona again keeps one entry.
    assert cache_view.pin_persona(persona) == count
    assert len(library.pins.list()) == 1

    assert cache_view.unpin(library.pins.list()[0]) == count
    assert library.pins.list() == []
    assert pinned_entries(engine) == 0
    assert engine.cache.stats()["index_entries"] == count, "unpinned blocks stay cached, under LRU again"


def test_pin_document_needs_a_document_and_pins_persona_and_document(
    chat: ChatService, library: Library, tmp_path: Path
) -> None:
    engine = chat.slot.engine
    assert engine is not None
    cache_view = CacheService(chat)
    chat.current.new_conversation(library.personas.get_by_name(PERSONA_NAME))
    with pytest.raises(ChatappError, match="no document"):
        cache_view.pin_document()
    assert library.pins.list() == []
    assert pinned_entries(engine) == 0

    path = tmp_path / "minutes.txt"
    path.write_text("\n".join(f"Item {n}: budget line {n * 7} is revisited in week {n + 2}." for n in range(1, 8)))
    view, tokens = chat.attach_document(path)
    count = cache_view.pin_document()
    assert count > 0
    assert pinned_entries(engine) == count
    (pin,) = library.pins.list()
    assert pin.kind == "document"
    assert "minutes.txt" in pin.label
    assert PERSONA_NAME in pin.label
    assert list(pin.tokens) == chat.next_question_tokens(view.root, as_document(view.document), [], "")
    assert len(pin.tokens) == tokens


def test_clear_empties_the_index_and_the_pins(chat: ChatService, library: Library) -> None:
    engine = chat.slot.engine
    assert engine is not None
    assert engine.cache is not None
    cache_view = CacheService(chat)
    chat.current.new_conversation()
    chat.ask("Name a fruit.").wait()
    cache_view.pin_persona(library.personas.get_by_name(PERSONA_NAME))
    engine.flush_cache()
    stored = int(engine.cache.stats()["index_entries"])
    assert stored > 0
    assert pinned_entries(engine) > 0
    assert cache_view.prune() == 0, "nothing has expired"
    assert engine.cache.stats()["index_entries"] == stored

    assert cache_view.clear() == stored
    stats = engine.cache.stats()
    assert stats["index_entries"] == 0
    assert stats["pinned_entries"] == 0
    assert stats["disk"]["entries"] == 0
    assert library.pins.list() == []
    assert cache_view.overview().pins == []


def test_without_an_engine_pins_are_refused(workspace: Workspace, library: Library) -> None:
    cache_view = CacheService(make_service(workspace, library, None))
    with pytest.raises(ChatappError, match="still loading"):
        cache_view.pin_persona(library.personas.get_by_name(PERSONA_NAME))
    with pytest.raises(ChatappError, match="still loading"):
        cache_view.clear()


def test_overview_reads_the_folder_until_the_engine_is_attached(workspace: Workspace, library: Library) -> None:
    # An earlier session on this data folder: one answer, its blocks on disk, its totals written.
    engine = workspace.open_engine(sequences=1)
    try:
        earlier = make_service(workspace, library, engine)
        earlier.current.new_conversation()
        prompt_tokens = earlier.ask("Name a fruit.").wait().stats.prompt_tokens
        engine.flush_cache()
        assert engine.cache is not None
        stored = int(engine.cache.stats()["index_entries"])
        assert stored > 0
    finally:
        engine.close()

    chat = make_service(workspace, library, None)
    cache_view = CacheService(chat)
    before = cache_view.overview()
    assert not before.live
    assert before.problem is None
    assert before.pins == []
    assert before.stats["directory"] == str(workspace.kv_cache_dir)
    assert before.stats["requests"] == 1
    assert before.stats["prompt_tokens"] == prompt_tokens
    assert before.stats["disk"]["entries"] == stored
    assert before.memory.startswith("plain KV cache: any cached prefix")

    engine = workspace.open_engine(sequences=1)
    try:
        chat.slot.attach(engine)
        after = cache_view.overview()
        assert after.live
        assert after.stats["index_entries"] == stored, "the running cache found the earlier session's blocks"
        assert after.stats["requests"] == 0, "a running cache counts this session's requests"
        assert after.stats["memory"]["kind"] == "plain"
        assert after.memory == before.memory
        assert before.restore_choice is None  # measured by a running engine only
        assert after.restore_choice is not None
        assert after.restore_choice.startswith("0 restored, 0 computed instead")
        chat.figures.ttft_ms.append(12.5)  # what an answer adds when it ends
        assert cache_view.overview().ttft_ms == [12.5]
    finally:
        engine.close()
