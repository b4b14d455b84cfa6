"""Tables and lines for people at a terminal, with every cell rendered literally.

Node names, finding messages, log lines, checkpoint paths, Slurm reasons and admin comments come
from nodes and job owners; rich reads `[...]` in a plain string as markup, so a path such as
`ckpt[/bold]` made `babysitter findings` fail for on-call (or restyled what it shows). Here
each cell is a `rich.text.Text` (literal, control characters stripped); only styles this code
chooses are applied."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text


def literal(value: object, style: str = "") -> Text:
    return value if isinstance(value, Text) else Text(str(value), style=style)


def table(*columns: str, rows: Iterable[Sequence[object]]) -> Table:
    t = Table(*columns)
    for row in rows:
        t.add_row(*(literal(c) for c in row))
    return t


def show(*items: object) -> None:
    """Print tables and lines; anything but a table is printed as literal text."""
    con = Console()
    for item in items:
        con.print(item if isinstance(item, Table) else literal(item))
