"""The model's answer as Markdown, streamed with Textual's MarkdownStream.

The stream batches fragments that arrive faster than the widget can draw, so
100+ tokens/s never backs up the screen; only the last block is re-parsed.
"""

from __future__ import annotations

from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownStream


class AssistantBlock(Markdown):
    DEFAULT_CSS = """
    AssistantBlock {
        height: auto;
        margin: 1 0 0 0;
        padding: 0 1;
        background: transparent;
    }
    """

    def __init__(self, text: str = "", **kwargs) -> None:
        super().__init__(text, **kwargs)
        self.text = text
        self._stream: MarkdownStream | None = None

    @property
    def streaming(self) -> bool:
        return self._stream is not None

    async def write(self, fragment: str) -> None:
        """Append streamed text (starts the stream on the first fragment)."""
        self.text += fragment
        if self._stream is None:
            self._stream = Markdown.get_stream(self)
        await self._stream.write(fragment)

    async def finish(self) -> None:
        """Draw what is still pending and stop streaming."""
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.stop()
