"""The models the chat screen can switch to: what `chatapp models` lists, with whether each fits now."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chatapp.models.catalog import FoundModel
from chatapp.services.machine_memory import available_memory_bytes, fit_problem
from chatapp.services.model_list import model_row
from chatapp.services.startup import Workspace


@dataclass(frozen=True)
class ModelChoice:
    """One row of the model picker."""

    name: str
    path: Path
    fields: tuple[str, ...]  # as `chatapp models` shows them (model_list.COLUMNS)
    current: bool  # the model answering now
    problem: str  # why it cannot be chosen ("" when it can): not a language model, does not fit


def model_choices(workspace: Workspace, current: Path | None, free_bytes: int | None = None) -> list[ModelChoice]:
    """Every model on this machine, the one answering first; `free_bytes` is the memory free now
    (measured when not given: the model answering keeps its memory while the new one loads)."""
    free = available_memory_bytes() if free_bytes is None else free_bytes
    choices = [
        _choice(model, current, free) for model in workspace.model_catalog().models() if model.summary is not None
    ]
    return sorted(choices, key=lambda choice: not choice.current)


def _choice(model: FoundModel, current: Path | None, free: int) -> ModelChoice:
    is_current = current is not None and _same(model.path, current)
    problem = ""
    if not model.can_chat:
        problem = model.problem or f"a {model.summary.use.value if model.summary else 'file'}, not a language model"
    elif not is_current:
        problem = fit_problem(model.size_bytes, free_bytes=free)
    return ModelChoice(model.name, model.path, model_row(model), is_current, problem)


def _same(left: Path, right: Path) -> bool:
    try:
        return left.resolve() == right.resolve()
    except OSError:
        return left == right


def file_fit_problem(path: Path, free_bytes: int | None = None) -> str:
    """Why the model at `path` would not fit beside the one answering ("" when it would)."""
    try:
        size = path.stat().st_size
    except OSError as error:
        return f"cannot read it: {error.strerror}"
    return fit_problem(size, free_bytes=free_bytes)
