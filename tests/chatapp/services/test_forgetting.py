"""Deleting a conversation or a persona removes from the cache's RAM and disk, at once, what only it used (in
effect its text), on the real bundled model: a document nothing else is about goes; a persona another
conversation begins with stays."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from cache.blocks import BlockInfo
from cache.keys import common_prefix_length
from cache.prefix_cache import PrefixCache
from chatapp.engine.engine import Engine
from chatapp.services.branches import as_document
from chatapp.services.chat_service import ChatService
from chatapp.services.forgetting import Forgetting
from chatapp.services.library import Library
from chatapp.services.messages import Turn, conversation_messages
from chatapp.services.prompt_plan import builder_of
from chatapp.services.startup import Workspace
from chatapp.vocabulary import Role
from tests.chatapp.services.test_chat_service import unique_document
from tests.model_factory import write_tiny_llama
from tests.service_support import attach, cold_service, make_service

TEMPLATES = Path(__file__).parents[1] / "prompting" / "templates"


@pytest.fixture
def service(workspace: Workspace, library: Library, shared_engine: Engine) -> Iterator[ChatService]:
    chat = make_service(workspace, library, shared_engine)
    yield chat
    chat.stop_warming()


def asked(service: ChatService, question: str) -> tuple[int, ...]:
    """Ask on the open branch and wait; the prompt its next question would begin with (the whole branch)."""
    service.ask(question).wait()
    view = service.current.view()
    path = service.conversations.path(view.leaf.id)
    return tuple(service.next_question_tokens(path[0], as_document(view.document), path[1:], ""))


def held(cache: PrefixCache, entries: list[BlockInfo]) -> tuple[int, int, int]:
    """How many of `entries` the cache holds: in its index, in RAM, on disk."""
    return (
        sum(info.key in cache.index for info in entries),
        sum(info.key in cache.ram for info in entries),
        len(cache.disk.holding(entries)),
    )


def ready_beyond(engine: Engine, prompt: tuple[int, ...], shared: int) -> bool:
    """Whether a whole state kept ready holds more of `prompt` than its first `shared` tokens."""
    array = np.asarray(prompt)
    return any(common_prefix_length(tokens, array) > shared for tokens in engine.placer.ready.kept_tokens())


def along(cache: PrefixCache, prompt: tuple[int, ...]) -> list[BlockInfo]:
    return cache.index.entries_along(np.asarray(prompt))


def test_deleting_a_conversation_forgets_its_document_and_keeps_the_shared_persona(
    service: ChatService, library: Library, shared_engine: Engine, tmp_path: Path
) -> None:
    cache = shared_engine.cache
    assert cache is not None
    persona = library.personas.create("Forgetful archivist", "You are an archivist. Answer in one sentence. " * 20)
    service.current.new_conversation(persona)
    attach(service, unique_document(tmp_path, "lighthouse"))
    with_document = asked(service, "Which site is counted last?")
    deleted = service.current.view().conversation.id
    service.current.new_conversation(persona)
    other = asked(service, "What do you keep?")
    shared_engine.flush_cache()

    persona_prefix = tuple(service.next_question_tokens(service.current.view().root, None, [], ""))
    shared = {info.key for info in [*along(cache, other), *along(cache, persona_prefix)]}
    document_entries = [info for info in along(cache, with_document) if info.key not in shared]
    persona_entries = along(cache, persona_prefix)
    assert len(document_entries) >= 2  # the document, the question and the answer: on disk and in RAM
    assert held(cache, document_entries)[2] == len(document_entries)
    assert persona_entries
    kept_before = held(cache, persona_entries)
    assert ready_beyond(shared_engine, with_document, len(persona_prefix))  # its whole state, kept ready

    service.current.delete(deleted)
    service.forgetting.wait()  # the cache's work runs off the deleting thread
    assert held(cache, document_entries) == (0, 0, 0)
    assert not ready_beyond(shared_engine, with_document, len(persona_prefix))
    assert ready_beyond(shared_engine, other, len(persona_prefix))  # the other conversation's stays
    assert held(cache, persona_entries) == kept_before
    assert cache.lookup(np.asarray(other)).tokens > len(persona_prefix)  # the other conversation still reuses


def test_deleting_a_persona_keeps_what_its_conversations_use_and_their_deletion_then_forgets_it(
    service: ChatService, library: Library, shared_engine: Engine
) -> None:
    cache = shared_engine.cache
    assert cache is not None
    persona = library.personas.create("Short-lived tutor", "You are a patient tutor of Latin grammar. " * 20)
    service.current.new_conversation(persona)
    prompt = asked(service, "Decline 'rosa'.")
    conversation = service.current.view().conversation.id
    shared_engine.flush_cache()
    persona_prefix = tuple(service.next_question_tokens(service.current.view().root, None, [], ""))
    entries = along(cache, prompt)
    persona_entries = along(cache, persona_prefix)
    assert persona_entries
    before = held(cache, entries)

    service.personas.delete(persona)  # the conversation keeps its copy of the persona, and its entries
    service.forgetting.wait()
    assert held(cache, entries) == before
    service.current.delete(conversation)  # nothing begins with the persona any more
    service.forgetting.wait()
    assert held(cache, persona_entries) == (0, 0, 0)
    assert held(cache, entries) == (0, 0, 0)


def test_a_question_left_without_an_answer_is_forgotten_as_sent_and_never_stops_a_deletion(
    tmp_path: Path, model_path: Path
) -> None:
    """On a template that refuses two user turns in a row (Gemma's), a branch ending in a question that got no
    answer (the app closed, the engine failed) is read as the prompt that question sent."""
    gemma_like = write_tiny_llama(tmp_path / "gemma-like.gguf", chat_template=(TEMPLATES / "gemma2.jinja").read_text())
    with cold_service(tmp_path / "data", gemma_like) as (service, library):
        engine = service.slot.engine
        assert engine is not None
        view = service.current.new_conversation()
        question = service.conversations.add_message(view.conversation.id, view.root.id, Role.USER, "Still there?")
        forgetting = Forgetting(library.conversations, library.personas, lambda: engine)
        (prompt,) = forgetting._conversation_prompts(engine, view.conversation.id)
        sent = builder_of(engine).build(conversation_messages("", None, [Turn(Role.USER, question.content)]))
        assert list(prompt) == sent  # with the generation prompt, as the question was sent
        service.current.delete(view.conversation.id)  # no cache here: nothing to forget, and no refusal
        assert service.current.list_conversations() == []
