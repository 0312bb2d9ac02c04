"""A tiny HTML/SVG element builder: text is escaped unless it is :class:`Markup`.

``el("rect", x=1.25, y=2, fill="#fff", title="a < b")`` gives
``<rect x="1.2" y="2" fill="#fff"><title>a &lt; b</title></rect>``. Attribute
names lose a trailing underscore and turn ``_`` into ``-`` (``class_``,
``text_anchor``); ``None`` attributes are left out; floats keep one decimal
(SVG coordinates) unless passed as strings.
"""
from __future__ import annotations

import html
from typing import Any, Iterable, Sequence

__all__ = ["Markup", "escape", "el", "svg", "rect", "text", "line", "polyline", "table", "legend", "note"]


class Markup(str):
    """A string that is already HTML: :func:`escape` leaves it alone."""

    __slots__ = ()


def escape(value: Any) -> Markup:
    """``value`` as HTML text (``&``, ``<``, ``>`` and quotes escaped), unless it is Markup."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(str(value), quote=True))


def _attr(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return html.escape(str(value), quote=True)


def _children(children: Iterable[Any]) -> str:
    out = []
    for child in children:
        if child is None:
            continue
        if isinstance(child, (list, tuple)):
            out.append(_children(child))
        else:
            out.append(escape(child))
    return "".join(out)


def el(tag: str, *children: Any, title: Any = None, **attrs: Any) -> Markup:
    """Element ``tag`` with ``children`` (escaped unless Markup; lists flattened; None skipped).

    ``title`` becomes a ``<title>`` child (an SVG tooltip). Without children the element is
    self-closed (``<line .../>``), which HTML5 accepts for SVG elements and void tags.
    """
    names = " ".join(f'{k.rstrip("_").replace("_", "-")}="{_attr(v)}"' for k, v in attrs.items() if v is not None)
    head = f"<{tag} {names}" if names else f"<{tag}"
    body = _children(children) + (f"<title>{escape(title)}</title>" if title is not None else "")
    return Markup(f"{head}>{body}</{tag}>" if body or tag not in _SELF_CLOSING else f"{head}/>")


_SELF_CLOSING = frozenset({"line", "rect", "polyline", "path", "circle", "meta", "br"})


def svg(width: int, height: int, *children: Any, label: str | None = None) -> Markup:
    """An inline ``<svg>`` of ``width`` x ``height`` pixels."""
    return el("svg", *children, width=width, height=height, viewBox=f"0 0 {width} {height}",
              role="img" if label else None, aria_label=label)


def rect(x: float, y: float, width: float, height: float, fill: str, *, title: Any = None, cls: str | None = None,
         opacity: float = 1.0, **attrs: Any) -> Markup:
    """A filled rectangle, at least half a pixel wide; ``opacity`` below 1 sets ``fill-opacity``."""
    return el("rect", class_=cls, x=float(x), y=float(y), width=float(max(width, 0.5)), height=float(height),
              fill=fill, fill_opacity=f"{opacity:.2f}" if opacity < 0.995 else None, title=title, **attrs)


def text(x: float, y: float, content: Any, *, anchor: str | None = None, title: Any = None) -> Markup:
    """An SVG text label; ``anchor`` is ``"middle"`` or ``"end"`` (default start)."""
    return el("text", content, x=_coord(x), y=_coord(y), text_anchor=anchor, title=title)


def line(x1: float, y1: float, x2: float, y2: float, stroke: str) -> Markup:
    return el("line", x1=_coord(x1), y1=_coord(y1), x2=_coord(x2), y2=_coord(y2), stroke=stroke)


def polyline(xs: Sequence[float], ys: Sequence[float], stroke: str, *, title: Any = None) -> Markup:
    """An unfilled line through ``(xs[i], ys[i])``."""
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    return el("polyline", fill="none", stroke=stroke, stroke_width="1.2", points=points, title=title)


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> Markup:
    """A plain table; the first column is left aligned, the others right (CSS)."""
    head = el("tr", [el("th", c) for c in header])
    return el("table", head, [el("tr", [el("td", c) for c in row]) for row in rows])


def legend(entries: Iterable[tuple[str, Any]]) -> Markup:
    """Colour swatches: ``(colour, label)`` pairs."""
    return el("div", [el("span", el("i", style=f"background:{colour}"), label) for colour, label in entries],
              class_="legend")


def note(content: Any) -> Markup:
    return el("p", content, class_="note")


def _coord(value: float) -> str:
    """Integers as they are, other numbers with one decimal."""
    return str(value) if isinstance(value, int) else f"{value:.1f}"
