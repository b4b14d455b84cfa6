"""Slurm hostlist expressions (`node[1-3,5],gpu-a[01-02]`) expanded in Python."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {expr!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {expr!r}")
    parts.append("".join(cur))
    return [p for p in (x.strip() for x in parts) if p]


def _expand_one(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item]
    prefix, body, rest = item[: m.start()], m.group(1), item[m.end() :]
    out: list[str] = []
    for rng in body.split(","):
        r = _RANGE.match(rng.strip())
        if not r:
            raise ValueError(f"bad range {rng!r} in hostlist {item!r}")
        lo_s, hi_s = r.group(1), r.group(2) or r.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo or hi - lo > 100_000:
            raise ValueError(f"bad range {rng!r} in hostlist {item!r}")
        width = len(lo_s)
        if "[" not in rest:  # the common case: nothing more to expand (no regex per name)
            out.extend(f"{prefix}{i:0{width}d}{rest}" for i in range(lo, hi + 1))
            continue
        for i in range(lo, hi + 1):
            out.extend(_expand_one(f"{prefix}{i:0{width}d}{rest}"))
    return out


def expand(expr: str | None) -> list[str]:
    """`node[1-3]` -> ['node1', 'node2', 'node3']; '' / '(null)' / None -> []."""
    if not expr or expr in ("(null)", "None"):
        return []
    out: list[str] = []
    for part in _split_top(expr):
        out.extend(_expand_one(part))
    return out
