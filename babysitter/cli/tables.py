"""Tables and lines for people at a terminal, with every cell rendered literally.

Node names, finding messages, log lines, checkpoint paths, Slurm reasons and admin comments come
from nodes and job owners; rich reads `[...]` in a plain string as markup, so a path such as
`ckpt[/bold]` made `babysitter findings` fail for on-call (or restyled what it shows). Here
each cell is a `rich.text.Text` (literal, control characters made visible: `printable`); only
styles this code chooses are applied. rich itself strips only a few controls (BEL, BS, CR, ...)
and lets ESC through: a finding message `ESC]0;...BEL` retitled the on-call's terminal and
`ESC[2J` cleared it. Lines printed without a table go through `echo`, alike."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

# controls (C0, DEL, C1: ESC, CSI 0x9b, OSC 0x9d, ...), format characters (bidi overrides,
# zero-width) and line/paragraph separators: none is ever written to the terminal as it is
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp"})


def printable(value: object) -> str:
    """`value` as text that cannot drive a terminal: tabs and line breaks become spaces, any
    other control or invisible format character its escape (`\\x1b`, `\\u202e`)."""
    text = str(value)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in "\t\n\r":
            out.append(" ")
        elif unicodedata.category(ch) in _HIDDEN:
            out.append(ascii(ch)[1:-1])
        else:
            out.append(ch)
    return "".join(out)


def literal(value: object, style: str = "") -> Text:
    if isinstance(value, Text):
        # built by this code around data: kept when already printable, else rebuilt
        shown = printable(value.plain)
        return value if shown == value.plain else Text(shown, style=value.style)
    return Text(printable(value), style=style)


def echo(value: object, err: bool = False) -> None:
    """One line for a person (click.echo), made printable first."""
    click.echo(printable(value), err=err)


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
