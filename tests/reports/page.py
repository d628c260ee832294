"""A report read back the way a browser's parser would (stdlib `html.parser`): tags, section texts, style."""
from __future__ import annotations

import base64
from html.parser import HTMLParser

VOID = frozenset({"meta", "link", "img", "br", "hr", "input", "col", "source", "wbr", "area", "base"})
URL_ATTRS = frozenset({"src", "href", "srcset", "action", "formaction", "poster", "data", "background", "cite"})


class Page(HTMLParser):
    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.sections: dict[str, str] = {}
        self.ids: dict[str, str] = {}
        self.style = ""
        self.title = ""
        self._section: str | None = None
        self._open: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag not in VOID:
            self._open.append(tag)
        if attributes.get("id"):
            self.ids[attributes["id"] or ""] = tag
        if tag == "section" and attributes.get("id"):
            self._section = attributes["id"]
            self.sections[self._section] = ""

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1] == tag:
            self._open.pop()
        if tag == "section":
            self._section = None

    def handle_data(self, data: str) -> None:
        current = self._open[-1] if self._open else ""
        if current == "style":
            self.style += data
        elif current == "title":
            self.title += data
        elif self._section is not None:
            self.sections[self._section] += data

    def urls(self) -> list[str]:
        return [v or "" for _, attrs in self.tags for k, v in attrs.items() if k in URL_ATTRS]

    def images(self) -> list[bytes]:
        """Every `<img>`'s PNG, decoded from its data URI."""
        prefix = "data:image/png;base64,"
        out = []
        for tag, attrs in self.tags:
            if tag == "img":
                src = attrs.get("src") or ""
                assert src.startswith(prefix), src[:80]
                out.append(base64.b64decode(src[len(prefix):], validate=True))
        return out
