"""Figure P: prefill speed with nothing cached, flash attention off and on."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.benchmark import prefill_figure
from chatapp.benchmark.peers import PeerAnswer, PeerSettings
from chatapp.benchmark.prefill_figure import PrefillFigures, measure_prefill, prefill_figure_verdicts, prefill_table
from chatapp.engine.contract import LocalEngine
from chatapp.engine.handle import GenerationHandle
from chatapp.engine.opening import EngineConfig, start_local_engine
from chatapp.engine.requests import GenerationRequest
from tests.chatapp.benchmark.figure_support import measured


@pytest.mark.slow
def test_chatapp_prefill_is_measured_with_flash_attention_off_and_on(tiny_model: Path) -> None:
    settings = PeerSettings(model_path=tiny_model, context=512, threads=1)
    figures = measured(measure_prefill, settings, None, prompt_tokens=80, repeats=2)
    assert set(figures.tokens_per_s) == {"chatapp", "chatapp flash"}  # llama-server not asked for
    assert all(speed > 0 for speed in figures.tokens_per_s.values())
    assert figures.prompt_tokens > 80
    assert set(figures.decode_tokens_per_s) == {"chatapp", "chatapp flash"}
    assert all(speed > 0 for speed in figures.decode_tokens_per_s.values()), "one stream's answer tokens per second"
    assert prefill_figure_verdicts(figures) == []  # no yardstick without llama-server


class RecordingServer:
    """Stands in for llama-server's process: answers at once, and notes each request in the shared log."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.closed = False

    def ask(self, prompt_tokens: tuple[int, ...], max_tokens: int) -> PeerAnswer:
        self.log.append(f"server {'prefill' if max_tokens == 1 else 'decode'}")
        return PeerAnswer("", tuple(range(max_tokens)), 10.0, 10.0 + max_tokens, len(prompt_tokens), 0)

    def settle(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.mark.slow
def test_both_sides_are_asked_in_turns_and_chatapp_is_idle_before_the_servers_turn(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts alternate between the sides, then answers do; each chatapp request has left its engine idle
    (the answer's recompute done) before llama-server is asked."""
    log: list[str] = []
    servers: list[RecordingServer] = []

    def server(*_args: object, **_kwargs: object) -> RecordingServer:
        servers.append(RecordingServer(log))
        return servers[-1]

    monkeypatch.setattr(prefill_figure, "uncached_server", server)
    start_engine = start_local_engine

    def noted_engine(config: EngineConfig) -> LocalEngine:
        engine = start_engine(config)
        generate, flush = engine.generate, engine.flush_cache

        def noted_generate(request: GenerationRequest) -> GenerationHandle:
            log.append(f"chatapp {'prefill' if request.sampling.max_tokens == 1 else 'decode'}")
            return generate(request)

        def noted_flush() -> None:
            flush()
            log.append("chatapp idle")

        monkeypatch.setattr(engine, "generate", noted_generate)
        monkeypatch.setattr(engine, "flush_cache", noted_flush)
        return engine

    monkeypatch.setattr(prefill_figure, "start_local_engine", noted_engine)
    settings = PeerSettings(model_path=tiny_model, context=512, threads=1)
    figures = measured(measure_prefill, settings, Path("llama-server"), prompt_tokens=80, repeats=2)
    turns = ["chatapp prefill", "chatapp idle", "server prefill"] * 2
    turns += ["chatapp decode", "chatapp idle", "server decode"] * 2
    assert log == turns * 2  # flash attention off, then on
    assert [server.closed for server in servers] == [True, True]
    assert set(figures.decode_tokens_per_s) == {"chatapp", "llama-server", "chatapp flash", "llama-server flash"}


def test_the_verdicts_compare_each_mode_with_llama_servers_flash_attention() -> None:
    speeds = {"chatapp": 90.0, "chatapp flash": 110.0, "llama-server": 80.0, "llama-server flash": 100.0}
    verdicts = prefill_figure_verdicts(PrefillFigures(2000, 3, speeds, 1.0))
    assert [(verdict.value, verdict.met) for verdict in verdicts] == [(1.1, True), (0.9, False)]


def test_the_decode_row_is_judged_against_llama_server_at_097() -> None:
    speeds = {"chatapp": 100.0, "chatapp flash": 101.0, "llama-server": 80.0, "llama-server flash": 100.0}
    for chatapp, met in ((98.0, True), (96.0, False)):
        decoding = {"chatapp": chatapp, "chatapp flash": chatapp, "llama-server flash": 100.0}
        figures = PrefillFigures(2000, 3, speeds, 1.0, decoding)
        (decode,) = [verdict for verdict in prefill_figure_verdicts(figures) if "decode" in verdict.measure]
        assert (decode.value, decode.met) == (chatapp / 100.0, met)


@pytest.mark.parametrize(
    ("prefill_on", "decode_on", "advice"),
    [
        (132.0, 103.0, "on"),  # AVX2 kernels on one Xeon: prefill gains
        (100.0, 110.0, "on"),
        (96.0, 86.0, "off"),  # both lose
        (140.0, 90.0, "off"),  # one gains, the other loses
        (120.0, 96.0, "off"),
        (106.0, 107.0, "off"),  # within one run's noise
    ],
)
def test_the_table_says_whether_flash_attention_pays(prefill_on: float, decode_on: float, advice: str) -> None:
    speeds = {"chatapp": 100.0, "chatapp flash": prefill_on}
    figures = PrefillFigures(2000, 3, speeds, 1.0, {"chatapp": 100.0, "chatapp flash": decode_on})
    expected = (
        f"prefill {prefill_on / 100:.2f}x, decode {decode_on / 100:.2f}x its speed off in this run "
        f"(by the rule `auto` measures with at load: {advice} for the TUI and ask"
    )
    assert expected in prefill_table(figures)
    assert "last 64 prompt tokens again" in prefill_table(figures)
    assert "answers are decoded one at a time" in prefill_table(figures)  # what it costs `chatapp serve`


def test_no_advice_without_both_settings_measured() -> None:
    figures = PrefillFigures(2000, 3, {"chatapp": 100.0, "chatapp flash": 150.0}, 1.0, {"chatapp": 100.0})
    assert "flash attention on:" not in prefill_table(figures)


@pytest.mark.parametrize(
    ("chatapp_flash_prefill", "judged"),
    [(90.0, 97.0), (120.0, 99.0)],  # flash attention pays not / pays for chatapp: its default is off / on
)
def test_the_decode_goal_is_judged_with_each_default(chatapp_flash_prefill: float, judged: float) -> None:
    speeds = {
        "chatapp": 90.0,
        "chatapp flash": chatapp_flash_prefill,
        "llama-server": 80.0,
        "llama-server flash": 100.0,
    }
    decoding = {"chatapp": 97.0, "chatapp flash": 99.0, "llama-server": 130.0, "llama-server flash": 100.0}
    (decode,) = [
        v for v in prefill_figure_verdicts(PrefillFigures(2000, 3, speeds, 1.0, decoding)) if "decode" in v.measure
    ]
    assert decode.value == pytest.approx(judged / 100.0)  # against llama-server's default, flash attention on
