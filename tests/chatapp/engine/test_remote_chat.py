"""Chat mode: chatapp in front of a server that builds its own prompts (vLLM, SGLang, Ollama, OpenAI-style).

The server here is a real `chatapp serve` asked through its OpenAI chat endpoint; a second one in
front of it, driving it in chat mode, offers no tokenizer, as such servers do, so a third client
finds chat mode on its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chatapp.engine.events import AnswerText
from chatapp.engine.opening import connect_remote_engine
from chatapp.engine.remote_chat import RemoteChatEngine
from chatapp.engine.remote_http import RemoteClient, RemoteConfig, RemoteEngineError
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.prompting.prompt import ChatMessage
from chatapp.services import startup
from chatapp.services.completions import ApiMessage, CompletionRequest, CompletionService, RequestError
from chatapp.services.prompt_plan import builder_of
from chatapp.vocabulary import ReuseTier, Role, StopReason
from tests.server_support import SYSTEM_PROMPT, Backend, RunningServer, running_server

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def chat_engine(url: str, key: str | None = None, model: str | None = None) -> RemoteChatEngine:
    return RemoteChatEngine(RemoteClient(RemoteConfig(url, api_key=key, model=model)))


@pytest.fixture(scope="module")
def chat(backend: Backend) -> Iterator[RemoteChatEngine]:
    engine = chat_engine(backend.url, backend.key)
    yield engine
    engine.close()


def _messages(question: str) -> tuple[ChatMessage, ...]:
    return (ChatMessage.of(Role.SYSTEM, SYSTEM_PROMPT), ChatMessage.of(Role.USER, question))


def test_the_server_builds_the_prompt_and_the_answer_is_its_own(chat: RemoteChatEngine, backend: Backend) -> None:
    served = backend.server.serving
    assert chat.prompt_builder is None
    assert chat.info.name == served.model.id
    assert chat.info.n_ctx_per_sequence == served.model.context_tokens
    assert "chat messages" in chat.info.description

    messages = _messages("Which lighthouse guards Eddystone rocks?")
    handle = chat.generate(GenerationRequest((), GREEDY, messages=messages))
    streamed = "".join(event.text for event in handle.events() if isinstance(event, AnswerText))
    result = handle.wait()
    prompt = tuple(builder_of(served.engine).build(list(messages)))
    alone = served.engine.generate(GenerationRequest(prompt, GREEDY, use_cache=False)).wait()
    assert streamed == result.text == alone.text
    assert result.token_ids == (), "a chat API sends no ids: the answer goes back as text"
    assert result.stats.prompt_tokens == len(prompt)

    # The next turn sends the answer back as text; the server still reuses the conversation's start.
    follow_up = (*messages, ChatMessage.of(Role.ASSISTANT, result.text), ChatMessage.of(Role.USER, "Why?"))
    second = chat.generate(GenerationRequest((), GREEDY, messages=follow_up)).wait()
    assert second.stats.reuse_tier is ReuseTier.SERVER
    assert second.stats.reused_tokens >= len(builder_of(served.engine).build(list(messages[:1])))


def test_a_warm_up_computes_the_prefix_and_shows_nothing(chat: RemoteChatEngine) -> None:
    messages = (*_messages("")[:1], ChatMessage.of(Role.USER, "Name one lighthouse in"))
    handle = chat.generate(GenerationRequest((), GREEDY, prefill_only=True, messages=messages))
    assert not [event for event in handle.events() if isinstance(event, AnswerText)]
    assert handle.wait().stop_reason is StopReason.PREFILLED


def test_a_model_the_server_does_not_have_is_one_line_and_there_is_no_tokenizer(
    chat: RemoteChatEngine, backend: Backend
) -> None:
    with pytest.raises(RemoteEngineError) as raised:
        chat_engine(backend.url, backend.key, model="no-such-model")
    message = str(raised.value)
    assert "does not serve 'no-such-model'" in message
    assert backend.server.serving.model.id in message
    assert "--backend-model" in message
    assert chat.prompt_builder is None, "no tokenizing facet: the server builds its prompts"


@pytest.fixture(scope="module")
def chat_only_front(
    tmp_path_factory: pytest.TempPathFactory, model_path: Path, backend: Backend
) -> Iterator[RunningServer]:
    """A `chatapp serve` driving the backend in chat mode: like vLLM, it has no /props or /tokenize."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(startup, "connect_remote_engine", lambda config: RemoteChatEngine(RemoteClient(config)))
        serving = running_server(
            tmp_path_factory.mktemp("chat-front"), model_path, backend=backend.url, backend_key=backend.key
        )
        running = serving.__enter__()
    try:
        yield running
    finally:
        serving.__exit__(None, None, None)


def test_a_server_without_a_tokenizer_is_driven_by_chat_messages(chat_only_front: RunningServer) -> None:
    engine = connect_remote_engine(RemoteConfig(chat_only_front.url))
    try:
        assert isinstance(engine, RemoteChatEngine)
        assert startup.engine_notices(engine)[0].startswith(f"the engine at {chat_only_front.url} builds its own")
        result = engine.generate(
            GenerationRequest((), GREEDY, messages=_messages("Name a lighthouse in Wales."))
        ).wait()
        assert result.text
        assert result.stop_reason in (StopReason.END, StopReason.LENGTH)
    finally:
        engine.close()


def test_a_prompt_the_server_builds_is_not_counted_here(chat: RemoteChatEngine) -> None:
    """Anthropic's count_tokens on such a backend: a clear refusal, not a count of 0."""
    request = CompletionRequest(SamplingParams(), messages=(ApiMessage(Role.USER, "Hello"),))
    with pytest.raises(RequestError, match="cannot be counted"):
        CompletionService(chat, "model-a").count_prompt(request)
