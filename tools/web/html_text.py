"""HTML to Markdown a model can read: headings, lists, links, tables and code kept;
scripts, styles, forms and inline images' data left out; links made absolute so the
model can fetch what a page points to.

markdownify (MIT, on BeautifulSoup) does the conversion; this module only cleans the
tree before it and the blank lines after it.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from urllib.parse import urljoin

from bs4 import BeautifulSoup, MarkupResemblesLocatorWarning, Tag, XMLParsedAsHTMLWarning
from markdownify import MarkdownConverter

# A page is parsed as HTML whatever it looks like (XHTML, a body that is one URL):
# bs4's hints about that would only reach the terminal the TUI draws on.
warnings.filterwarnings("ignore", category=XMLParsedAsHTMLWarning)
warnings.filterwarnings("ignore", category=MarkupResemblesLocatorWarning)

# Elements with nothing to read in them (or only machinery: forms, embedded players).
DROPPED_TAGS = (
    "script",
    "style",
    "noscript",
    "template",
    "svg",
    "canvas",
    "iframe",
    "object",
    "embed",
    "form",
    "button",
    "input",
    "select",
    "textarea",
    "head",
)
# Link schemes worth showing; `javascript:` and `data:` URLs are noise or payloads.
KEPT_LINK_SCHEMES = ("http:", "https:", "mailto:", "ftp:")
_BLANK_RUNS = re.compile(r"\n[ \t]*(?:\n[ \t]*){2,}")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")


@dataclass(frozen=True)
class PageText:
    title: str | None
    markdown: str


def html_to_markdown(html: str | bytes, base_url: str) -> PageText:
    """The page as Markdown. Bytes are decoded by BeautifulSoup from the page's own
    declaration (`<meta charset>`), for pages whose server named no charset."""
    soup = BeautifulSoup(html, "html.parser")
    title_tag = soup.find("title")
    title = " ".join(title_tag.get_text().split()) if title_tag else ""
    base = _base_url(soup, base_url)
    for tag in soup.find_all(DROPPED_TAGS):
        tag.decompose()
    for tag in soup.find_all(attrs={"hidden": True}):
        tag.decompose()
    for tag in soup.find_all(attrs={"aria-hidden": "true"}):
        tag.decompose()
    _absolute_links(soup, base)
    markdown = MarkdownConverter(heading_style="ATX", bullets="-", escape_misc=False).convert_soup(
        soup
    )
    markdown = _TRAILING_SPACE.sub("\n", markdown)
    markdown = _BLANK_RUNS.sub("\n\n", markdown).strip()
    return PageText(title=title or None, markdown=markdown)


def _base_url(soup: BeautifulSoup, page_url: str) -> str:
    base = soup.find("base", href=True)
    if isinstance(base, Tag):
        return urljoin(page_url, str(base["href"]))
    return page_url


def _absolute_links(soup: BeautifulSoup, base: str) -> None:
    for link in soup.find_all("a"):
        href = link.get("href")
        if not href:
            continue
        target = urljoin(base, str(href).strip())
        if target.lower().startswith(KEPT_LINK_SCHEMES):
            link["href"] = target
        else:
            del link["href"]  # the text stays, without a link
    for image in soup.find_all("img"):
        src = str(image.get("src") or "").strip()
        target = urljoin(base, src) if src else ""
        if target.lower().startswith(("http:", "https:")):
            image["src"] = target
        else:
            # A data: URI can be megabytes of base64; the alt text says what it shows.
            alt = str(image.get("alt") or "").strip()
            image.replace_with(f"[image: {alt}]" if alt else "")
