"""The remote engine against a real `chatapp serve` on loopback: prompts, answers, reuse and failures.

The server runs in this process, so a test can hold its engine at a known answer token; the
remote engine talks to it over real HTTP, through a proxy a test can cut (the server
'killed' mid-answer).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chatapp.benchmark.llama_server import LlamaServerPeer, default_llama_server_path
from chatapp.benchmark.server_process import free_port
from chatapp.engine.events import AnswerText
from chatapp.engine.gate import Step
from chatapp.engine.opening import connect_remote_engine
from chatapp.engine.remote import RemoteConfig, RemoteEngine, RemoteEngineError, served_model_fingerprint
from chatapp.engine.requests import GenerationRequest, SamplingParams
from chatapp.errors import ContextOverflowError
from chatapp.prompting.prompt import ChatMessage
from chatapp.services.prompt_plan import builder_of
from chatapp.vocabulary import ReuseTier, Role, StopReason
from tests.chatapp.engine.test_ignore_eos import SHORT_ANSWER
from tests.cut_proxy import CutProxy
from tests.server_support import SYSTEM_PROMPT, Backend, RunningServer

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def server(backend: Backend) -> RunningServer:
    return backend.server


@pytest.fixture(scope="module")
def proxy(backend: Backend) -> CutProxy:
    return backend.proxy


@pytest.fixture(scope="module")
def remote(backend: Backend) -> Iterator[RemoteEngine]:
    engine = connect_remote_engine(RemoteConfig(backend.url, api_key=backend.key))
    assert isinstance(engine, RemoteEngine), "chatapp serve shares its template and tokenizer: token ids"
    yield engine
    engine.close()


def _messages(question: str) -> list[ChatMessage]:
    return [ChatMessage.of(Role.SYSTEM, SYSTEM_PROMPT), ChatMessage.of(Role.USER, question)]


def test_the_model_card_and_prompts_come_from_the_server(remote: RemoteEngine, server: RunningServer) -> None:
    local = server.serving.engine
    assert remote.info.server == remote.client.base_url
    assert remote.info.n_ctx_per_sequence == local.info.n_ctx_per_sequence
    assert remote.info.path is None
    assert remote.cache is None, "the cache is the server's: nothing to administer here"
    assert remote.prompt_builder is not None, "prompts are built here, as tokens"
    messages = _messages("Which lighthouse stands on the Farne Islands?")
    assert remote.prompt_builder.build(messages) == builder_of(local).build(messages)
    marker = builder_of(local).tokenize("<|im_end|>", parse_special=True)
    assert remote.tokenize("<|im_end|>", parse_special=True) == marker
    assert remote.detokenize(builder_of(local).tokenize("Longstone light")) == "Longstone light"


def test_a_served_model_is_known_by_what_its_server_says_of_it(remote: RemoteEngine, server: RunningServer) -> None:
    """Remembered answer ids are keyed by this: another model behind the same address gets other keys."""
    props = server.serving.props()
    assert remote.info.fingerprint == served_model_fingerprint(props)
    for key, other in (("model_path", "/models/other.gguf"), ("chat_template", "{{ messages }}"), ("n_vocab", 7)):
        assert served_model_fingerprint({**props, key: other}) != remote.info.fingerprint, key


def test_an_answer_equals_the_servers_own_and_the_next_turn_reuses_it(
    remote: RemoteEngine, server: RunningServer
) -> None:
    messages = _messages("Which lighthouse guards Eddystone rocks?")
    prompt = tuple(remote.prompt_builder.build(messages))
    handle = remote.generate(GenerationRequest(prompt, GREEDY))
    streamed = [event for event in handle.events() if isinstance(event, AnswerText)]
    result = handle.wait()
    # The user reads the answer: the server computes its tokens again in batches meanwhile (a request
    # sent at once would stop that, and the next turn would reuse the prompt only).
    server.serving.engine.flush_cache()
    alone = server.serving.engine.generate(GenerationRequest(prompt, GREEDY, use_cache=False)).wait()
    assert (result.text, result.token_ids) == (alone.text, alone.token_ids)
    assert "".join(event.text for event in streamed) == result.text
    # Ids come with the result, checked against the text; streamed pieces carry text only.
    assert all(event.token_id == -1 for event in streamed)
    assert result.stats.generated_tokens == len(result.token_ids)

    answered = [*messages, ChatMessage(Role.ASSISTANT, (result.text,), result.token_ids)]
    follow_up = tuple(remote.prompt_builder.build([*answered, ChatMessage.of(Role.USER, "And its height?")]))
    assert follow_up[: len(prompt)] == prompt  # append-only across the wire
    second = remote.generate(GenerationRequest(follow_up, GREEDY)).wait()
    assert second.stats.reuse_tier is ReuseTier.SERVER
    # The server kept the prompt and the answer it generated: everything before the new turn.
    assert second.stats.reused_tokens >= len(prompt) + len(result.token_ids) - 1
    assert second.stats.reused_tokens + second.stats.computed_tokens == len(follow_up)


def test_a_warm_up_leaves_the_prefix_on_the_server(remote: RemoteEngine) -> None:
    document = "The keeper's log: " + "storm, calm, fog, clear night. " * 40
    prefix = tuple(remote.prompt_builder.build([ChatMessage.of(Role.SYSTEM, document)], add_generation_prompt=False))
    warm = remote.generate(GenerationRequest(prefix, GREEDY, prefill_only=True)).wait()
    assert warm.stop_reason is StopReason.PREFILLED
    assert warm.text == ""
    assert warm.token_ids == ()
    question = tuple(remote.prompt_builder.build([ChatMessage.of(Role.SYSTEM, document), *_messages("Fog?")[1:]]))
    assert question[: len(prefix)] == prefix
    asked = remote.generate(GenerationRequest(question, GREEDY)).wait()
    assert asked.stats.reused_tokens >= len(prefix) - 1
    assert asked.stats.computed_tokens <= len(question) - len(prefix) + 1


def test_ignore_eos_reaches_the_server(remote: RemoteEngine, server: RunningServer) -> None:
    """The server forbids the end tokens too: the answer runs to max_tokens (on most CPUs it ends sooner)."""
    prompt = tuple(remote.prompt_builder.build(_messages(SHORT_ANSWER)))
    sampling = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with server.engine.holding(Step.TOKEN, 1, where=lambda request: request.sampling.ignore_eos) as arrived:
        handle = remote.generate(GenerationRequest(prompt, sampling))
        assert arrived.wait_until_holding(), "the server's request carries ignore_eos"
    answered = handle.wait()
    assert answered.stop_reason is StopReason.LENGTH
    assert answered.stats.generated_tokens == 24


def test_cancelling_keeps_what_was_said(remote: RemoteEngine, server: RunningServer) -> None:
    prompt = tuple(remote.prompt_builder.build(_messages("Tell me a long story about a lighthouse.")))
    with server.engine.holding(Step.TOKEN, 2) as gate:
        handle = remote.generate(
            GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
        )
        events = handle.events()
        received = [next(events), next(events)]
        assert gate.wait_until_holding()
        handle.cancel()
        result = handle.wait()
    assert result.stop_reason is StopReason.CANCELLED
    said = "".join(event.text for event in received if isinstance(event, AnswerText))
    assert said
    assert result.text.startswith(said)
    assert result.token_ids == ()  # a cut-off answer's ids are never trusted: its text is tokenized


def test_a_server_dying_mid_answer_is_one_clear_error_and_the_next_request_works(
    remote: RemoteEngine, server: RunningServer, proxy: CutProxy
) -> None:
    prompt = tuple(remote.prompt_builder.build(_messages("Describe the lamp room.")))
    with server.engine.holding(Step.TOKEN, 3) as gate:
        handle = remote.generate(
            GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True))
        )
        events = handle.events()
        received = [next(events) for _ in range(3)]
        assert gate.wait_until_holding()
        proxy.cut()
        with pytest.raises(RemoteEngineError, match="broke") as raised:
            list(events)
    assert all(isinstance(event, AnswerText) for event in received)
    assert str(raised.value).count("\n") == 0
    again = remote.generate(GenerationRequest(prompt, GREEDY)).wait()  # the 'restarted' server answers
    assert again.stop_reason in (StopReason.END, StopReason.LENGTH)
    assert again.text


def test_a_prompt_longer_than_the_servers_context_is_refused_here(remote: RemoteEngine) -> None:
    too_long = tuple([1] * remote.info.n_ctx_per_sequence)
    with pytest.raises(ContextOverflowError) as raised:
        remote.generate(GenerationRequest(too_long, GREEDY))
    assert raised.value.context_tokens == remote.info.n_ctx_per_sequence


def test_a_wrong_key_is_one_clear_line(proxy: CutProxy) -> None:
    with pytest.raises(RemoteEngineError, match=r"refused the API key \(HTTP 401\); set --backend-key"):
        connect_remote_engine(RemoteConfig(proxy.url, api_key="wrong"))


def test_an_unreachable_server_is_one_clear_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RemoteEngineError, match=r"cannot reach the engine at .*; start the server or fix --backend"):
        connect_remote_engine(RemoteConfig(url))


def test_an_openai_style_address_finds_the_server_root(proxy: CutProxy) -> None:
    assert RemoteConfig(f"{proxy.url}/v1/").base_url == proxy.url


@pytest.fixture(scope="module")
def llama_server(model_path: Path) -> Iterator[LlamaServerPeer]:
    binary = default_llama_server_path()
    if not binary.is_file():
        pytest.skip("llama-server not built: run tools/build_llama_server.py to run the remote tests against it")
    with LlamaServerPeer(binary, model_path, context=1024, threads=1, cache_ram_mib=64) as peer:
        yield peer


def test_llama_server_as_the_remote_engine(llama_server: LlamaServerPeer, backend: Backend) -> None:
    engine = connect_remote_engine(RemoteConfig(f"http://127.0.0.1:{llama_server.port}"))
    assert isinstance(engine, RemoteEngine)
    try:
        messages = _messages("Which lighthouse guards Eddystone rocks?")
        prompt = tuple(engine.prompt_builder.build(messages))
        assert list(prompt) == backend.server.engine.prompt_builder.build(messages)  # same template, same ids
        first = engine.generate(GenerationRequest(prompt, GREEDY)).wait()
        assert first.text
        assert len(first.token_ids) == first.stats.generated_tokens > 0
        answered = [*messages, ChatMessage(Role.ASSISTANT, (first.text,), first.token_ids)]
        follow_up = tuple(engine.prompt_builder.build([*answered, ChatMessage.of(Role.USER, "How tall?")]))
        second = engine.generate(GenerationRequest(follow_up, GREEDY)).wait()
        assert second.stats.reuse_tier is ReuseTier.SERVER
        assert second.stats.reused_tokens >= len(prompt)
    finally:
        engine.close()
