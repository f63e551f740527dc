"""The web: `web_fetch` (tool.py) gets an http(s) URL as text; url.py checks URLs and
hosts, transport.py connects only to addresses it checked, fetch.py streams within
caps, html_text.py turns HTML into Markdown."""
