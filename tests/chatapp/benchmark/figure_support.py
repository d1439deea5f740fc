"""Measuring a bench figure in a test, as the runner does: with a PromptKit of the model, closed after."""

from __future__ import annotations

from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from chatapp.benchmark.peers import PeerSettings
from chatapp.benchmark.workloads import PromptKit

P = ParamSpec("P")
T = TypeVar("T")


def measured(
    measure: Callable[Concatenate[PeerSettings, PromptKit, P], T],
    settings: PeerSettings,
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """`measure(settings, kit, *args, **kwargs)` with a PromptKit of the settings' model."""
    kit = PromptKit(settings.model_path)
    try:
        return measure(settings, kit, *args, **kwargs)
    finally:
        kit.close()
