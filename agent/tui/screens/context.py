"""`/context`: what is resident in the prompt, by part and by file, with their tokens."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from agent.core.context_report import ContextReport
from agent.tui.format import tokens
from agent.tui.widgets.status_bar import meter


def overview(report: ContextReport) -> Text:
    approx = "~" if report.token_count == "estimate" else ""
    what = {"full": "the whole repository", "map": "a repository map"}.get(report.mode, "nothing")
    used = report.prompt_tokens
    text = Text()
    text.append(f"Epoch {report.epoch}: {what} is resident.\n", style="bold")
    text.append_text(meter(report.snapshot_tokens, used, report.window, cells=40))
    text.append(f"  {approx}{tokens(used)} of {tokens(report.window)} tokens\n")
    rows = [
        ("system prompt and tools", report.fixed_tokens),
        (f"repository snapshot ({len(report.files)} files)", report.snapshot_tokens),
        (f"conversation ({report.messages} messages)", report.conversation_tokens),
        ("free", report.free_tokens),
    ]
    for label, count in rows:
        text.append(f"  {label:<40}{approx}{count:>10,}\n")
    if report.omitted:
        count = len(report.omitted)
        noun = "file" if count == 1 else "files"
        text.append(
            f"  {count} {noun} left out (by rules, size, binary, or only in the map).", "dim"
        )
    return text


class ContextScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q", "dismiss", "Back")]
    DEFAULT_CSS = """
    ContextScreen { align: center middle; }
    ContextScreen > Vertical {
        width: 90%;
        height: 90%;
        border: round $accent;
        background: $panel;
        padding: 0 1;
    }
    ContextScreen .overview { height: auto; margin: 0 0 1 0; }
    ContextScreen DataTable { height: 1fr; }
    """

    def __init__(self, report: ContextReport) -> None:
        super().__init__()
        self.report = report

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(overview(self.report), classes="overview")
            yield DataTable(cursor_type="row", zebra_stripes=True)
            yield Static("Esc goes back", classes="hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("file", "tokens", "share", "")
        total = self.report.snapshot_tokens or 1
        for file in self.report.files:
            table.add_row(
                file.path,
                Text(f"{file.tokens:,}", justify="right"),
                Text(f"{file.tokens / total:.1%}", justify="right"),
                Text("changed since snapshot", style="yellow") if file.stale else "",
            )
        for path, why in self.report.omitted:
            table.add_row(Text(path, style="dim"), "", "", Text(f"left out: {why}", style="dim"))
        table.focus()

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(None)
