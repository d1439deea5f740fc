"""Sizing the tiers: reuse of the user's own requests against the disk and RAM budgets, as a plot, with
the suggested disk budget one key away from the settings screen (chatapp/services/cache_advice.py)."""

from __future__ import annotations

import math

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static
from textual_plotext import PlotextPlot

from chatapp.errors import ChatappError
from chatapp.services.cache_advice import Advice, BudgetRow, advice_summary
from chatapp.services.cache_view import CacheService
from chatapp.services.units import byte_size
from chatapp.tui.settings_screen import SettingsScreen

MIB = 1 << 20


class CacheAdviceScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "close", "Close", id="advice.close"),
        Binding("a", "apply", "Apply suggestion", id="advice.apply"),
    ]

    def __init__(self, service: CacheService) -> None:
        super().__init__(classes="dialog-screen")
        self.service = service
        self.advice: Advice | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label(
                "Sizing the tiers from your own requests  ·  A applies the suggestion  ·  Esc closes",
                classes="dialog-title",
            )
            yield Static("Replaying the request log…", id="advice-summary")
            yield PlotextPlot(id="advice-plot")
            yield Static("", id="advice-suggestion")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Apply suggestion", variant="primary", id="apply", disabled=True)
                yield Button("Close", id="close")

    def on_mount(self) -> None:
        self._load()

    @work(thread=True, exclusive=True, group="cache-advice")
    def _load(self) -> None:
        try:
            advice = self.service.advice()
        except ChatappError as error:
            self.app.call_from_thread(self.notify, str(error), severity="error", timeout=10)
            return
        self.app.call_from_thread(self._show, advice)

    def _show(self, advice: Advice | None) -> None:
        self.advice = advice
        summary = self.query_one("#advice-summary", Static)
        if advice is None:
            summary.update("No requests logged yet: ask a few questions, then open this again.")
            return
        summary.update(advice_summary(advice))
        self.query_one("#advice-suggestion", Static).update(f"Suggestion: {advice.suggestion}")
        self.query_one("#apply", Button).disabled = advice.suggested_disk_mib is None
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        for rows, name in ((advice.disk, "reused (disk budget)"), (advice.ram, "from RAM (RAM budget)")):
            finite = [row for row in rows if not math.isinf(row.budget_bytes)]
            plt.plot(
                [_x(row) for row in finite], [100 * row.reused_share for row in finite], label=name, marker="braille"
            )
        ticks = [row for row in advice.disk if not math.isinf(row.budget_bytes)][::2]
        plt.xticks([_x(row) for row in ticks], [byte_size(int(row.budget_bytes)).replace(".0 ", " ") for row in ticks])
        plt.vline(math.log2(advice.disk_budget_bytes / MIB), "red")
        plt.ylim(0, 100)
        plt.ylabel("% of prompt tokens")
        plt.title(f"disk budget in force: {byte_size(advice.disk_budget_bytes)} (red)")
        plot.refresh()

    @on(Button.Pressed, "#apply")
    def action_apply(self) -> None:
        if self.advice is None or self.advice.suggested_disk_mib is None:
            self.notify("Nothing to apply: the budget in force keeps what these requests reuse.")
            return
        suggested = {"cache_disk_mib": str(self.advice.suggested_disk_mib)}
        self.app.push_screen(SettingsScreen(self.service.chat.workspace, suggested=suggested))

    @on(Button.Pressed, "#close")
    def action_close(self) -> None:
        self.dismiss(None)


def _x(row: BudgetRow) -> float:
    return math.log2(row.budget_bytes / MIB)
