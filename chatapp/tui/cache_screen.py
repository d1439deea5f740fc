"""The cache made visible: each tier's bytes, entries and budget, the hit rate, pinned
prefixes (pin or unpin the persona or document), prune and clear, and first-token times."""

from __future__ import annotations

from collections.abc import Callable

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Label, OptionList, Sparkline, Static
from textual.widgets.option_list import Option

from chatapp.errors import ChatappError
from chatapp.services.cache_view import CacheOverview, CacheService
from chatapp.services.pins import describe_pin
from chatapp.services.units import byte_size, count_of
from chatapp.tui.dialogs import Confirm


class CacheScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "close", "Close", id="cache.close"),
        Binding("r", "refresh", "Refresh", id="cache.refresh"),
    ]

    def __init__(self, service: CacheService) -> None:
        super().__init__(classes="dialog-screen")
        self.service = service
        self.overview: CacheOverview | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("KV cache  ·  R refreshes  ·  Esc closes", classes="dialog-title")
            yield Label("", id="cache-summary")
            yield Static("", id="cache-memory")
            yield Static("", id="cache-divergence")
            yield DataTable(id="tiers", cursor_type="none")
            yield Label("Time to first token this session (ms)", classes="sidebar-title")
            yield Sparkline([], id="ttft")
            yield Label("", id="ttft-range", classes="dialog-hint")
            yield Label("Pinned prefixes (kept from eviction and expiry)", classes="sidebar-title", id="pins-title")
            yield OptionList(id="pins")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Pin persona", id="pin-persona")
                yield Button("Pin document", id="pin-document")
                yield Button("Unpin", id="unpin")
                yield Button("Size the tiers…", id="advise")
                yield Button("Prune expired", id="prune")
                yield Button("Clear cache", variant="error", id="clear")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("Tier", "Entries", "Bytes", "Budget", "Reused tokens", "Hits", "Misses", "Evictions")
        self.action_refresh()

    def action_refresh(self) -> None:
        try:
            self.overview = self.service.overview()
        except ChatappError as error:
            self.notify(str(error), severity="error")
            return
        self._show(self.overview)

    def _show(self, overview: CacheOverview) -> None:
        stats = overview.stats
        ram, disk = stats.get("ram", {}), stats.get("disk", {})
        hit_rate = float(stats.get("hit_rate", 0.0))
        source = "this session" if overview.live else "all sessions (model not loaded)"
        local = overview.server is None
        for selector in ("#tiers", "#pins", "#pins-title", ".dialog-buttons"):
            for widget in self.query(selector):
                widget.display = local
        summary = (
            f"Hit rate {hit_rate:.0%} of prompt tokens over "
            f"{count_of(int(stats.get('requests', 0)), 'answer')} ({source})"
            f"  ·  reused {int(stats.get('reused_tokens', 0)):,} of {int(stats.get('prompt_tokens', 0)):,} tokens"
        )
        memory = f"Model memory: {overview.memory}"
        if overview.restore_choice:
            memory += f"\nCache hits: {overview.restore_choice}"
        if overview.checks:
            memory += f"\nRestore checks: {overview.checks}"
        self.query_one("#cache-memory", Static).update(memory)
        self.query_one("#cache-divergence", Static).update(
            f"Last prompt that left an earlier one: {overview.divergence}"
            if overview.divergence
            else "No prompt this session has left an earlier one part-way."
        )
        if overview.problem:
            summary += f"  ·  {overview.problem}"
        self.query_one("#cache-summary", Label).update(summary)
        reused = stats.get("reused_by_tier", {})
        table = self.query_one(DataTable)
        table.clear()
        table.add_row("Live context", "", "", "", f"{int(reused.get('device', 0)):,}", "", "", "")
        for name, key, tier in (("RAM", "ram", ram), ("Disk", "disk", disk)):
            table.add_row(
                name,
                f"{int(tier.get('entries', 0)):,}",
                byte_size(int(tier.get("bytes", 0))),
                byte_size(int(tier.get("budget_bytes", 0))),
                f"{int(reused.get(key, 0)):,}",
                f"{int(tier.get('hits', 0)):,}",
                f"{int(tier.get('misses', 0)):,}",
                f"{int(tier.get('evictions', 0)):,}",
            )
        self.query_one(Sparkline).data = overview.ttft_ms or [0.0]
        if overview.ttft_ms:
            low, high, last = min(overview.ttft_ms), max(overview.ttft_ms), overview.ttft_ms[-1]
            self.query_one("#ttft-range", Label).update(
                f"{count_of(len(overview.ttft_ms), 'answer')} · min {low:,.0f} · max {high:,.0f} · last {last:,.0f}"
            )
        else:
            self.query_one("#ttft-range", Label).update("no answers yet in this session")
        pins = self.query_one("#pins", OptionList)
        pins.clear_options()
        for pin in overview.pins:
            pins.add_option(Option(describe_pin(pin), id=str(pin.id)))
        if not overview.pins:
            pins.add_option(Option("(nothing pinned)", id="none", disabled=True))

    def action_close(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#pin-persona")
    def pin_persona(self) -> None:
        self._run(self.service.pin_open_persona, "Pinned the persona: {count} blocks.")

    @on(Button.Pressed, "#pin-document")
    def pin_document(self) -> None:
        self._run(self.service.pin_document, "Pinned the document: {count} blocks.")

    @on(Button.Pressed, "#unpin")
    def unpin(self) -> None:
        options = self.query_one("#pins", OptionList)
        if self.overview is None or options.highlighted is None:
            self.notify("Highlight a pinned prefix first.", severity="warning")
            return
        option_id = options.get_option_at_index(options.highlighted).id
        pin = next((p for p in self.overview.pins if str(p.id) == option_id), None)
        if pin is not None:
            self._run(lambda: self.service.unpin(pin), "Unpinned {count} blocks.")

    @on(Button.Pressed, "#advise")
    def advise(self) -> None:
        from chatapp.tui.cache_advice_screen import CacheAdviceScreen  # plotting loads only when asked for

        self.app.push_screen(CacheAdviceScreen(self.service))

    @on(Button.Pressed, "#prune")
    def prune(self) -> None:
        self._run(self.service.prune, "Pruned {count} expired entries.")

    @on(Button.Pressed, "#clear")
    def clear(self) -> None:
        def decided(yes: bool | None) -> None:
            if yes:
                self._run(self.service.clear, "Cleared {count} entries from the cache.")

        self.app.push_screen(Confirm("Clear every cached prefix (RAM and disk, pins too)?", yes="Clear"), decided)

    @work(thread=True, exclusive=True, group="cache-op")
    def _run(self, operation: Callable[[], int], message: str) -> None:
        self.app.call_from_thread(self.notify, "Working…", timeout=2)
        try:
            count = operation()
        except ChatappError as error:
            self.app.call_from_thread(self.notify, str(error), severity="error", timeout=10)
            return
        self.app.call_from_thread(self.notify, message.format(count=count))
        self.app.call_from_thread(self.action_refresh)
