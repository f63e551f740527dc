"""One tool call: a foldable block with its status, its arguments, its output and any diff."""

from __future__ import annotations

import json
from typing import Any

from textual.containers import VerticalScroll
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Collapsible, Static

from agent.tui.format import arguments, call_summary
from agent.tui.widgets.diff_block import DiffBlock

# status: (symbol, style, words shown after the call)
STATUS = {
    "pending": ("◌", "$text-warning", "waiting for approval"),
    "running": ("●", "$text-accent", "running"),
    "done": ("✓", "$text-success", ""),
    "failed": ("✗", "$text-error", "failed"),
    "denied": ("⊘", "$text-error", "denied"),
}


def _argument_lines(name: str, raw: str) -> str:
    args = arguments(raw)
    if not args:
        return raw.strip() or "(no arguments)"
    if isinstance(args.get("command"), str):
        return "$ " + args["command"]
    lines = []
    for key, value in args.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if isinstance(shown, str) and "\n" in shown:
            shown = shown.splitlines()[0] + f" … ({shown.count(chr(10)) + 1} lines)"
        lines.append(f"{key}: {shown}")
    return "\n".join(lines)


def _output_without_diff(output: str, diff: str) -> str:
    if diff and diff in output:
        return output.replace(diff, "").rstrip()
    return output.rstrip()


class ToolBlock(Collapsible):
    DEFAULT_CSS = """
    ToolBlock {
        height: auto;
        margin: 1 0 0 0;
        padding: 0;
        border-top: none;
        background: transparent;
    }
    ToolBlock > Contents { padding: 0 0 0 2; height: auto; }
    ToolBlock .tool-arguments { color: $text-muted; }
    ToolBlock .tool-output { height: auto; max-height: 16; background: $surface; }
    ToolBlock .tool-output > Static { padding: 0 1; }
    ToolBlock.-failed .tool-output > Static { color: $text-error; }
    """

    def __init__(self, call_id: str, name: str, raw_arguments: str, **kwargs: Any) -> None:
        self.call_id = call_id
        self.tool_name = name
        self.raw_arguments = raw_arguments
        self.summary = call_summary(name, raw_arguments)
        self.status = "running"
        self.output = ""
        self.diff: DiffBlock | None = None
        self.finished_detail = ""  # what the heading says once done (a subagent's summary)
        body = Static(_argument_lines(name, raw_arguments), markup=False, classes="tool-arguments")
        super().__init__(body, title=self._heading(), collapsed=True, **kwargs)

    def _heading(self, detail: str = "") -> Content:
        symbol, style, words = STATUS[self.status]
        parts: list[Any] = [(symbol, style), " ", (self.tool_name, "bold")]
        if self.summary:
            parts += [" ", self.summary]
        said = detail or words
        if said:
            parts += [(f" · {said}", "$text-muted")]
        return Content.assemble(*parts)

    def set_status(self, status: str, detail: str = "") -> None:
        self.status = status
        self.title = self._heading(detail)  # type: ignore[assignment]
        self.set_class(status in ("failed", "denied"), "-failed")

    async def add(self, widget: Widget) -> None:
        await self.query_one(Collapsible.Contents).mount(widget)

    async def finish(self, ok: bool, output: str, truncated: bool, data: dict[str, Any]) -> None:
        if self.status != "denied":
            detail = "output cut" if truncated else self.finished_detail
            self.set_status("done" if ok else "failed", detail)
        diff_text = data.get("diff") if isinstance(data.get("diff"), str) else ""
        self.output = _output_without_diff(output, diff_text)
        if self.output:
            await self.add(VerticalScroll(Static(self.output, markup=False), classes="tool-output"))
        if diff_text:
            self.diff = DiffBlock.from_unified(diff_text)
            if self.diff is not None:
                await self.add(self.diff)
        if self.diff is not None or not ok:
            self.collapsed = False
