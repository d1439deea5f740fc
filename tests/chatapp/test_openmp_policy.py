"""llama.cpp's OpenMP threads keep spinning at barriers with several teams alive (openmp_policy.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chatapp import openmp_policy
from chatapp.openmp_policy import SPIN_COUNT, WAIT_POLICY, keep_openmp_spinning, llama_cpp_uses_libgomp


def test_with_libgomp_the_policy_is_active_with_a_short_spin_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WAIT_POLICY, raising=False)
    monkeypatch.delenv(SPIN_COUNT, raising=False)
    monkeypatch.setattr(openmp_policy, "llama_cpp_uses_libgomp", lambda: True)
    keep_openmp_spinning()
    assert (os.environ[WAIT_POLICY], os.environ[SPIN_COUNT]) == ("active", "10000")


def test_a_wait_policy_the_user_chose_is_kept_and_nothing_else_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SPIN_COUNT, raising=False)
    monkeypatch.setenv(WAIT_POLICY, "passive")  # a spin count set beside it would override passive's none
    monkeypatch.setattr(openmp_policy, "llama_cpp_uses_libgomp", lambda: True)
    keep_openmp_spinning()
    assert os.environ[WAIT_POLICY] == "passive"
    assert SPIN_COUNT not in os.environ


def test_a_spin_count_the_user_chose_is_kept_beside_the_active_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `active`, libgomp spins only 100 times once two engines' threads outnumber the CPUs."""
    monkeypatch.delenv(WAIT_POLICY, raising=False)
    monkeypatch.setenv(SPIN_COUNT, "300000")
    monkeypatch.setattr(openmp_policy, "llama_cpp_uses_libgomp", lambda: True)
    keep_openmp_spinning()
    assert (os.environ[WAIT_POLICY], os.environ[SPIN_COUNT]) == ("active", "300000")


def test_without_libgomp_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """LLVM's OpenMP reads the same variable, and there `active` keeps idle threads spinning."""
    monkeypatch.delenv(WAIT_POLICY, raising=False)
    monkeypatch.delenv(SPIN_COUNT, raising=False)
    monkeypatch.setattr(openmp_policy, "llama_cpp_uses_libgomp", lambda: False)
    keep_openmp_spinning()
    assert WAIT_POLICY not in os.environ
    assert SPIN_COUNT not in os.environ


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the loaded libraries from /proc")
def test_the_library_llama_cpp_loads_is_the_one_detected() -> None:
    import llama_cpp  # noqa: F401  (loaded by now anyway: its libraries are in the process)

    loaded = Path("/proc/self/maps").read_text()
    assert ("libgomp" in loaded) == llama_cpp_uses_libgomp()
