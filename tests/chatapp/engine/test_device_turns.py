"""The device's turns: engines in a build with a device take them one at a time, in order; in a CPU build
none waits."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from chatapp.engine.device_turns import DEVICE, FairLock
from chatapp.engine.engine import Engine, EngineConfig
from chatapp.engine.events import GenerationResult
from chatapp.engine.llama_native import offload_device
from chatapp.engine.requests import GenerationRequest, SamplingParams
from tests.model_factory import TINY_MODEL_THREADS, write_tiny_llama

WAIT_SECONDS = 300.0  # only a hang comes near it


def wait_for_waiters(lock: FairLock, count: int) -> None:
    """Poll until `count` threads wait on `lock` (a state they reach, however slow the machine)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while lock.waiting < count:
        assert time.monotonic() < deadline, f"{lock.waiting} waiters, expected {count}"
        time.sleep(0.001)


def test_turns_go_in_the_order_they_were_asked_for() -> None:
    lock = FairLock()
    order: list[str] = []

    def take(name: str) -> None:
        with lock.held():
            order.append(name)

    lock.acquire()
    threads = []
    for count, name in enumerate(("first", "second", "third"), start=1):
        thread = threading.Thread(target=take, args=(name,))
        thread.start()
        threads.append(thread)
        wait_for_waiters(lock, count)
    order.append("holder")
    lock.release()
    for thread in threads:
        thread.join(WAIT_SECONDS)
    assert order == ["holder", "first", "second", "third"]
    assert lock.waiting == 0


def test_a_holder_takes_its_turn_again_without_waiting_and_others_wait_for_the_outer_release() -> None:
    lock = FairLock()
    got = threading.Event()

    def other() -> None:
        with lock.held():
            got.set()

    lock.acquire()
    lock.acquire()  # re-entered: a step inside the load, say
    thread = threading.Thread(target=other)
    thread.start()
    wait_for_waiters(lock, 1)
    lock.release()
    assert not got.is_set(), "the inner release hands nothing over"
    assert lock.waiting == 1
    lock.release()
    thread.join(WAIT_SECONDS)
    assert got.is_set()


def test_a_thread_that_does_not_hold_the_turn_cannot_release_it() -> None:
    lock = FairLock()
    lock.acquire()
    errors: list[BaseException] = []

    def release() -> None:
        try:
            lock.release()
        except RuntimeError as error:
            errors.append(error)

    thread = threading.Thread(target=release)
    thread.start()
    thread.join(WAIT_SECONDS)
    lock.release()
    assert len(errors) == 1


@pytest.mark.skipif(offload_device() is not None, reason="in a build with a device every engine takes turns")
def test_an_engine_in_a_cpu_build_loads_and_answers_while_the_device_is_held(tmp_path: Path) -> None:
    """Engines in a CPU build never take the device's turn (this one would wait for ever if it did)."""
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    config = EngineConfig(model_path=path, context_cap=256, sequences=1, threads=TINY_MODEL_THREADS, n_gpu_layers=0)
    results: list[GenerationResult] = []

    def load_and_answer() -> None:  # on a thread: a regression fails here instead of hanging the suite
        with Engine(config) as engine:
            request = GenerationRequest((5, 6, 7, 8), SamplingParams(temperature=0.0, max_tokens=2), use_cache=False)
            results.append(engine.generate(request).wait())

    with DEVICE.held():
        thread = threading.Thread(target=load_and_answer, daemon=True)
        thread.start()
        thread.join(WAIT_SECONDS)
        assert not thread.is_alive(), "the engine waited for the device's turn"
    assert results[0].stats.generated_tokens == 2
