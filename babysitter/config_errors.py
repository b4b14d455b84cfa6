"""Why msgspec refused a config, as one line naming the key: from the models' types, not from
msgspec's wording (its ValidationError carries a message only).

Runs only after a conversion failed, so it may be slow and import what it needs. It walks the
input against the sections: an unknown key (or one an older release had), then each key's value
converted alone with its own type (constraints included), into dict entries and list items, and
last the section's own checks (`__post_init__`, which raise `InvalidKey`). What the key expects
is said from `msgspec.inspect.type_info` of its type.
"""

from __future__ import annotations

import difflib
import json
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
from msgspec import inspect as mi

from babysitter.settings import InvalidKey, Section, plain, section_fields, section_model

Convert = Callable[[Any, Any], Any]  # msgspec.convert with the config's options
Problem = tuple[list[str], str]  # the path to the key, and why
_BARE = re.compile(r"[A-Za-z0-9_-]+")  # a TOML bare key


def explain(
    data: Any, model: type[Section], convert: Convert, removed: Mapping[str, str]
) -> str | None:
    """`<dotted key>: <why>[ (got <value>)]` for the first problem in `data`, None if every key
    converts alone (then the caller says what msgspec said)."""
    found = _section(data, model, [], convert, removed)
    if found is None:
        return None
    path, why = found
    return f"{_dotted(path) or '<root>'}: {why}"


def _dotted(path: list[str]) -> str:
    """TOML's spelling: a.b."c.d"[2] (a dict's key with a dot in it is quoted)."""
    out = ""
    for p in path:
        if p.startswith("["):
            out += p
            continue
        out += ("." if out else "") + (p if _BARE.fullmatch(p) else json.dumps(p))
    return out


def _got(value: Any) -> str:
    return "" if isinstance(value, Mapping) else f" (got {value!r})"


def _section(
    data: Any, model: type[Section], path: list[str], convert: Convert, removed: Mapping[str, str]
) -> Problem | None:
    if not isinstance(data, Mapping):
        return path, f"expected a table{_got(data)}"
    fields = section_fields(model)
    for key in data:
        if key not in fields:
            where = [*path, str(key)]
            why = removed.get(_dotted(where))
            if why is None:
                close = difflib.get_close_matches(str(key), list(fields), n=1)
                why = "unknown key" + (f" (did you mean {close[0]}?)" if close else "")
            return where, why
    values: dict[str, Any] = {}
    for key, value in data.items():
        found = _value(value, fields[key], [*path, key], convert, removed)
        if found is not None:
            return found
        values[key] = convert(value, fields[key])
    try:
        model(**values)  # the section's own checks, with every value valid on its own
    except InvalidKey as exc:
        keys = exc.key.split(".")
        return [*path, *keys], exc.why + _got(_lookup(data, keys))
    except (ValueError, TypeError) as exc:
        # a check raising a plain ValueError("<key>: <why>"), this package's older convention
        key, sep, why = str(exc).partition(": ")
        keys = key.split(".")
        if sep and keys[0] in fields:
            return [*path, *keys], why + _got(_lookup(data, keys))
        return path, str(exc)
    return None


def _value(
    value: Any, ann: Any, path: list[str], convert: Convert, removed: Mapping[str, str]
) -> Problem | None:
    sub = section_model(plain(ann))
    if sub is not None:
        return _section(value, sub, path, convert, removed)
    try:
        convert(value, ann)
        return None
    except msgspec.ValidationError:
        pass
    # inside a dict or a list: name the entry
    t = plain(ann)
    origin = typing.get_origin(t)
    if origin is dict and isinstance(value, Mapping):
        key_type, value_type = typing.get_args(t)
        for k, v in value.items():
            try:
                convert(k, key_type)  # a TOML key is text: "79" is the XID 79
            except msgspec.ValidationError:
                return [*path, str(k)], f"a key here is {expected(key_type)}"
            found = _value(v, value_type, [*path, str(k)], convert, removed)
            if found is not None:
                return found
    elif origin is list and isinstance(value, list):
        (item_type,) = typing.get_args(t)
        for i, v in enumerate(value):
            found = _value(v, item_type, [*path, f"[{i}]"], convert, removed)
            if found is not None:
                return found
    info = _unwrap(mi.type_info(ann))
    if typing.get_origin(t) is typing.Literal:  # the choices in the order the model has them
        return path, f"not one of: {', '.join(map(str, typing.get_args(t)))}{_got(value)}"
    if isinstance(info, mi.EnumType):
        return path, f"not {expected(ann)}{_got(value)}"
    return path, f"expected {expected(ann)}{_got(value)}"


def _lookup(data: Any, keys: list[str]) -> Any:
    for k in keys:
        if not isinstance(data, Mapping):
            return None
        # a dict entry's key may be an int in the model and text in the file
        data = data.get(k, data.get(int(k)) if k.isdigit() else None)
    return data


def expected(ann: Any) -> str:
    """What a key of type `ann` takes, in words."""
    return _describe(mi.type_info(ann))


def _bounds(t: mi.IntType | mi.FloatType) -> str:
    parts = [
        f"{op} {v:g}"
        for op, v in ((">=", t.ge), (">", t.gt), ("<=", t.le), ("<", t.lt))
        if v is not None
    ]
    return " " + " and ".join(parts) if parts else ""


def _unwrap(t: mi.Type) -> mi.Type:
    """The type under a description (Meta(description=...) makes a Metadata)."""
    while isinstance(t, mi.Metadata):
        t = t.type
    return t


def _describe(t: mi.Type) -> str:
    t = _unwrap(t)
    if isinstance(t, mi.BoolType):
        return "true or false"
    if isinstance(t, mi.IntType):
        return "an integer" + _bounds(t)
    if isinstance(t, mi.FloatType):
        return "a number" + _bounds(t)
    if isinstance(t, mi.StrType):
        n = t.min_length
        rules = [f"at least {n} character{'s' if n != 1 else ''}"] if n else []
        rules += [f"matching {t.pattern}"] if t.pattern else []
        return "a string" + (f" ({', '.join(rules)})" if rules else "")
    if isinstance(t, mi.LiteralType):
        return "one of: " + ", ".join(map(str, t.values))
    if isinstance(t, mi.EnumType):
        return "one of: " + ", ".join(str(m.value) for m in t.cls)
    if isinstance(t, mi.ListType):
        return f"a list (each item {_describe(t.item_type)})"
    if isinstance(t, mi.DictType):
        return f"a table ({_describe(t.key_type)} -> {_describe(t.value_type)})"
    if isinstance(t, mi.UnionType):
        return " or ".join(_describe(x) for x in t.types if not isinstance(x, mi.NoneType))
    if isinstance(t, mi.StructType):
        return "a table"
    if isinstance(t, mi.CustomType):
        return "a path (a string)" if t.cls.__name__.endswith("Path") else t.cls.__name__
    return type(t).__name__.removesuffix("Type").lower()
