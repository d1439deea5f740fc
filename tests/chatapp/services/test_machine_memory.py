"""One memory-fit rule for the chat screen's model switch and the server's model pool."""

from __future__ import annotations

from chatapp.services.machine_memory import fit_problem, memory_needed

MIB = 1 << 20


def test_a_model_needs_a_little_more_than_its_file() -> None:
    assert memory_needed(1000 * MIB) == 1100 * MIB


def test_a_model_fits_in_the_memory_free_now_with_its_margin() -> None:
    assert fit_problem(900 * MIB, free_bytes=1000 * MIB) == ""
    assert fit_problem(950 * MIB, free_bytes=1000 * MIB) == "needs about 1.0 GiB, 1000.0 MiB free now"
    assert fit_problem(10_000 * MIB, free_bytes=0) == "", "where the system does not say, nothing is refused"


def test_with_a_budget_the_models_held_count_with_the_same_margin() -> None:
    budget = 2200 * MIB
    assert fit_problem(1000 * MIB, held_bytes=1000 * MIB, budget_bytes=budget, free_bytes=1 << 40) == ""
    refused = fit_problem(1001 * MIB, held_bytes=1000 * MIB, budget_bytes=budget, free_bytes=1 << 40)
    assert refused.startswith("needs about 1.1 GiB, 1.1 GiB of the 2.1 GiB budget left")
    assert fit_problem(1000 * MIB, budget_bytes=budget, free_bytes=500 * MIB).endswith("500.0 MiB free now")
