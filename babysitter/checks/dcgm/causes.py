"""Why `dcgmi diag` gave no verdict, in words an admin acts on: DCGM not installed, its host
engine (nv-hostengine) not running, or a DCGM too old for babysitter or for its host engine.

The words matched are the ones DCGM prints (NVIDIA/DCGM, tags v2.4.7, v3.3.9, v4.6.0):

- dcgmi/Command.cpp Connect(): "Error: unable to establish a connection to the specified
  host: HOST", then DoExecuteConnectionFailure(): "Error: Unable to connect to host engine.
  Host engine connection invalid/disconnected." (stdout). `dcgmi diag` of 2.x prints the first
  and then runs the diag in an embedded host engine; 3.x and 4.x try the embedded one silently
  and print "Error: Unable to start an embedded host engine. ERROR." only when that fails.
- dcgmlib/src/dcgm_errors.c errorString(), which dcgmi puts in a runtime_error ("Error: Unable
  to complete diagnostic for group N. Return: (CODE) : ERROR"): DCGM_ST_CONNECTION_NOT_VALID
  "Host engine connection invalid/disconnected", DCGM_ST_VER_MISMATCH "API version mismatch",
  DCGM_ST_NVVS_BINARY_NOT_FOUND "The NVVS binary was not found in the specified location".
"""

from __future__ import annotations

import errno
import re

HOSTENGINE = "DCGM host engine (nv-hostengine) not running"
TOO_OLD = "DCGM too old"
NOT_INSTALLED = "dcgmi not installed"
OLDEST_MAJOR = 2  # the oldest DCGM whose `dcgmi diag -j` babysitter reads (2.x: "Blacklist")

_HOSTENGINE = re.compile(
    r"unable to establish a connection to the specified host"
    r"|Unable to connect to host engine"
    r"|Unable to start an embedded host engine"
    r"|Host engine connection invalid/disconnected",
    re.IGNORECASE,
)
_MISMATCH = re.compile(r"API version mismatch", re.IGNORECASE)
_NO_NVVS = re.compile(r"NVVS binary was not found", re.IGNORECASE)


def _line(text: str, pattern: re.Pattern[str]) -> str:
    """DCGM's own line that says it (at most 200 characters)."""
    for line in text.splitlines():
        if pattern.search(line):
            return line.strip()[:200]
    return text.strip()[:200]


def from_text(text: str) -> str | None:
    """The cause DCGM's words in `text` (dcgmi's output, or a runtime_error) name, else None."""
    if _HOSTENGINE.search(text):
        return f"{HOSTENGINE}: {_line(text, _HOSTENGINE)}"
    if _MISMATCH.search(text):
        return (
            f"{TOO_OLD} or mismatched: dcgmi and nv-hostengine are of different DCGM versions "
            f"({_line(text, _MISMATCH)})"
        )
    if _NO_NVVS.search(text):
        return f"{NOT_INSTALLED} completely: {_line(text, _NO_NVVS)}"
    return None


def from_version(version: str) -> str | None:
    """A DCGM older than babysitter reads (its diag JSON named the version), else None."""
    m = re.match(r"\s*(\d+)\.", version)
    if m and int(m.group(1)) < OLDEST_MAJOR:
        return f"{TOO_OLD}: DCGM {version} (babysitter reads `dcgmi diag -j` of DCGM 2.x to 4.x)"
    return None


def from_oserror(exc: OSError) -> str:
    """dcgmi could not be started at all."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return f"{NOT_INSTALLED}: {exc.filename or exc}"
    return f"cannot run dcgmi: {exc}"
