"""Each peer answers greedily, alike, and says how much of the prompt it computed (tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.benchmark.peers import (
    PEERS,
    ChatappPeer,
    ChatappTypedPeer,
    ChatappWarmAheadPeer,
    IdealPeer,
    LlamaDiskCachePeer,
    LlamaPrefixPeer,
    LlamaRAMCachePeer,
    NoCachePeer,
    PeerAnswer,
    PeerFactory,
    PeerSettings,
)
from chatapp.benchmark.serve_peer import ChatappServePeer
from chatapp.benchmark.workloads import SCALES, Request, build_workloads
from tests.model_factory import TINY_MODEL_THREADS, write_tiny_llama

# Every peer loads a model and answers.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> PeerSettings:
    model = write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny.gguf")
    return PeerSettings(model_path=model, context=256, threads=TINY_MODEL_THREADS, ram_budget_bytes=1 << 30)


@pytest.fixture(scope="module")
def prompts(settings: PeerSettings) -> list[tuple[int, ...]]:
    """Workload A at the tiny scale: one persona three times, another, then the first again."""
    (workload,) = build_workloads(settings.model_path, SCALES["tiny"], ("A",))
    return [request.tokens for request in workload.requests]


def ask_all(
    peer_class: PeerFactory, settings: PeerSettings, folder: Path, prompts: list[tuple[int, ...]]
) -> list[PeerAnswer]:
    peer = peer_class(settings, folder)
    try:
        return [peer.ask(prompt, 4) for prompt in prompts]
    finally:
        peer.close()


def test_the_registry_names_every_peer() -> None:
    assert list(PEERS) == [
        "no-cache",
        "llama-prefix",
        "llama-ram",
        "llama-disk",
        "chatapp",
        "chatapp+warm",
        "chatapp+typed",
        "ideal",
    ]
    for name, factory in PEERS.items():
        assert factory.name == name


def test_no_cache_computes_every_prompt_whole(
    settings: PeerSettings, prompts: list[tuple[int, ...]], tmp_path: Path
) -> None:
    answers = ask_all(NoCachePeer, settings, tmp_path, prompts[:3])
    assert [answer.computed_tokens for answer in answers] == [len(prompt) for prompt in prompts[:3]]
    assert all(answer.prompt_tokens == len(prompt) for answer, prompt in zip(answers, prompts, strict=False))
    assert all(answer.text and answer.ttft_ms <= answer.total_ms for answer in answers)


@pytest.mark.parametrize("peer_class", [LlamaPrefixPeer, LlamaRAMCachePeer, LlamaDiskCachePeer, ChatappPeer])
def test_peers_reuse_a_shared_prefix_and_answer_like_no_cache(
    peer_class: PeerFactory, settings: PeerSettings, prompts: list[tuple[int, ...]], tmp_path: Path
) -> None:
    chosen = prompts[:2]  # the same persona, two questions
    reference = ask_all(NoCachePeer, settings, tmp_path / "ref", chosen)
    answers = ask_all(peer_class, settings, tmp_path / "peer", chosen)
    assert [answer.text for answer in answers] == [answer.text for answer in reference]
    assert answers[0].computed_tokens == len(chosen[0])
    assert answers[1].computed_tokens < len(chosen[1])


def test_chatapp_serve_answers_over_http_like_the_engine_in_process(
    settings: PeerSettings, prompts: list[tuple[int, ...]], tmp_path: Path
) -> None:
    chosen = prompts[:2]
    reference = ask_all(ChatappPeer, settings, tmp_path / "engine", chosen)
    peer = ChatappServePeer(settings, tmp_path / "serve")
    try:
        first = peer.ask(chosen[0], 4)
        peer.settle()  # the answer recomputed and stored, as the in-process peer waits for it
        second = peer.ask(chosen[1], 4)
        assert (peer.peak_rss_bytes() or 0) > 0
    finally:
        peer.close()
    assert [first.text, second.text] == [answer.text for answer in reference]
    assert [first.computed_tokens, second.computed_tokens] == [answer.computed_tokens for answer in reference]
    assert first.ttft_ms <= first.total_ms
    # Stopped with SIGTERM, the server wrote its cache: a new one on the folder restores the prefix.
    (after,) = ask_all(ChatappServePeer, settings, tmp_path / "serve", prompts[1:2])
    assert after.computed_tokens < len(prompts[1])


def test_chatapp_and_llama_disk_keep_prefixes_across_a_restart(
    settings: PeerSettings, prompts: list[tuple[int, ...]], tmp_path: Path
) -> None:
    for peer_class in (ChatappPeer, LlamaDiskCachePeer):
        folder = tmp_path / peer_class.name
        ask_all(peer_class, settings, folder, prompts[:1])
        (after,) = ask_all(peer_class, settings, folder, prompts[1:2])
        assert after.computed_tokens < len(prompts[1]), peer_class.name
    (ram_after,) = ask_all(LlamaRAMCachePeer, settings, tmp_path / "ram", prompts[1:2])
    assert ram_after.computed_tokens == len(prompts[1])


def test_chatapp_reports_the_engine_token_ids(
    settings: PeerSettings, prompts: list[tuple[int, ...]], tmp_path: Path
) -> None:
    (answer,) = ask_all(ChatappPeer, settings, tmp_path, prompts[:1])
    assert answer.token_ids is not None
    assert 0 < len(answer.token_ids) <= 4


@pytest.fixture(scope="module")
def document_requests(settings: PeerSettings) -> tuple[Request, ...]:
    """Workload C at the tiny scale: questions about one document, with the drafts the app would type."""
    (workload,) = build_workloads(settings.model_path, SCALES["tiny"], ("C",))
    return workload.requests


def run_requests(
    peer_class: PeerFactory, settings: PeerSettings, folder: Path, requests: tuple[Request, ...]
) -> list[tuple[PeerAnswer, dict[str, float] | None]]:
    """As the runner does: prepare, ask, settle."""
    peer = peer_class(settings, folder)
    try:
        results: list[tuple[PeerAnswer, dict[str, float] | None]] = []
        for request in requests:
            prepared = peer.prepare(request)
            results.append((peer.ask(request.tokens, 4), prepared))
            peer.settle()
        return results
    finally:
        peer.close()


def test_the_ideal_computes_only_what_no_earlier_request_shared(
    settings: PeerSettings, prompts: list[tuple[int, ...]], tmp_path: Path
) -> None:
    (workload,) = build_workloads(settings.model_path, SCALES["tiny"], ("A",))
    requests = workload.requests
    assert requests[0].known_prefix == 0
    assert all(request.known_prefix > 0 for request in requests[1:])
    results = run_requests(IdealPeer, settings, tmp_path / "ideal", requests)
    reference = ask_all(NoCachePeer, settings, tmp_path / "ref", [request.tokens for request in requests])
    assert [answer.computed_tokens for answer, _ in results] == [len(r.tokens) - r.known_prefix for r in requests]
    assert [answer.text for answer, _ in results] == [answer.text for answer in reference]


def test_warm_ahead_leaves_only_the_question_and_type_ahead_less(
    settings: PeerSettings, document_requests: tuple[Request, ...], tmp_path: Path
) -> None:
    first = document_requests[:1]
    ((plain, _),) = run_requests(ChatappPeer, settings, tmp_path / "plain", first)
    ((warm, warm_figures),) = run_requests(ChatappWarmAheadPeer, settings, tmp_path / "warm", first)
    ((typed, typed_figures),) = run_requests(ChatappTypedPeer, settings, tmp_path / "typed", first)
    request = first[0]
    assert plain.computed_tokens == len(request.tokens)
    assert warm.computed_tokens == len(request.tokens) - request.known_prefix  # the question, its closing, the header
    assert 2 <= typed.computed_tokens < warm.computed_tokens
    assert warm.text == plain.text == typed.text
    assert warm_figures is not None
    assert warm_figures["warm_ahead_ms"] > 0
    assert typed_figures is not None
    assert request.draft is not None
    assert typed_figures["warm_ups"] == len(request.draft.question.split()) - 1
    assert typed_figures["typing_lag_ms"] >= 0
    assert typed.ttft_ms >= typed_figures["typing_lag_ms"]


def test_peers_without_drafts_prepare_nothing(
    settings: PeerSettings, prompts: list[tuple[int, ...]], tmp_path: Path
) -> None:
    (workload,) = build_workloads(settings.model_path, SCALES["tiny"], ("A",))
    peer = ChatappWarmAheadPeer(settings, tmp_path)
    try:
        assert workload.requests[0].draft is None
        assert peer.prepare(workload.requests[0]) is None
    finally:
        peer.close()
