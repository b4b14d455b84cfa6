"""The kernel log as the NVIDIA driver prints it: its XID lines and every wording of a GPU lost
from the bus, read from a log file or /dev/kmsg. The formats are the driver's own printf formats
(NVIDIA/open-gpu-kernel-modules) and tests/data/world/kmsg/ holds real lines of each.

- `NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s` (kernel_rc.c); without `pid=`/`name=`
  when no process is known; `(PCI:… GPU-I:%02u[ GPU-CI:%02u])` under MIG; older drivers printed
  `Xid (0000:03:00)` without `PCI:`.
- `NVRM: GPU %04x:%02x:%02x.%x: GPU has fallen off the bus.` (NV_DEV_PRINTF in osHandleGpuLost):
  a bus loss that may come with no Xid line beside it.
- at probe time, one record over three lines (osapi.c):
  `NVRM: The NVIDIA GPU %04x:%02x:%02x.%x` / `NVRM: (PCI ID: %04x:%04x) installed in this system
  has` / `NVRM: fallen off the bus and is not responding to commands.`
- `NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus` (the wording this parser knew first).

A line that says "Xid" or "fallen off the bus" and matches none of these is counted and sampled
(checks/unparsed.py), never dropped: it is a format this parser has not learnt yet.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from babysitter.checks import unparsed

MAX_LINE = 4096
_PCI = r"[0-9A-Fa-f:.]{1,32}"
# ASCII digits only (`\d` also matches e.g. Arabic-Indic digits, which int() would read as an
# XID) and a bounded number: real XIDs have at most three digits; a longer one is not an XID line
XID_RE = re.compile(
    rf"NVRM: Xid \((?:PCI:)?({_PCI})((?: GPU-C?I:[0-9]{{1,3}}){{0,2}})\): "
    r"([0-9]{1,6})(?![0-9])(?:, (.*))?"
)
# the process the driver blames: pid is a number or '<unknown>' (quoted), name a comm or <unknown>
PROC_RE = re.compile(r"pid=('?<unknown>'?|[0-9]{1,10})(?:, name=([^,]{0,64}))?(?:,|$)")
OFF_BUS_RE = re.compile(rf"NVRM: GPU at PCI:({_PCI}): GPU has fallen off the bus")
OFF_BUS_DEV_RE = re.compile(rf"NVRM: GPU ({_PCI}): GPU has fallen off the bus")
PROBE_RE = re.compile(
    rf"NVRM: The NVIDIA GPU ({_PCI})\s.{{0,300}}?fallen off the bus and is not responding",
    re.DOTALL,
)
PROBE_HEAD_RE = re.compile(rf"NVRM: The NVIDIA GPU ({_PCI})\s*$")
PROBE_TAIL_RE = re.compile(r"NVRM: fallen off the bus and is not responding to commands")
# NVSwitch errors (nvidia-nvswitchN: SXid (PCI:…): 20034, …): the switch's, not a GPU's; the
# fabric checks own them, so here they are known and left alone (not "unparsed")
SXID_RE = re.compile(r"nvidia-nvswitch[0-9]*: SXid \(")
MENTIONS_RE = re.compile(r"xid|fallen off the bus", re.IGNORECASE)
CAUSED_BY_RE = re.compile(r"caused by previous Xid ([0-9]{1,6})")
# the kernel's own timestamp, `[ 1843.308145]` (seconds since boot), where the log keeps it
STAMP_RE = re.compile(r"\[\s*([0-9]{1,10}\.[0-9]{1,9})\]")
BUS_LOSS = "GPU has fallen off the bus"


class KmsgLine(msgspec.Struct, frozen=True):
    """What one kernel-log line (or one probe-time record) says about a GPU."""

    pci: str | None  # as printed: "0000:3b:00", "0000:b3:00.0"; None: not named
    xid: int | None  # None: a bus loss printed without an Xid number
    text: str  # the driver's message after the XID number (the bus loss: its wording)
    off_bus: bool = False
    pid: int | None = None
    name: str | None = None
    mig: str = ""  # "GPU-I:05 GPU-CI:01" when the driver attributed the XID to a MIG instance
    follows_xid: int | None = None  # the driver's own "caused by previous Xid N"
    stamp: float | None = None  # kernel seconds since boot, where the line carries them


def _proc(rest: str) -> tuple[int | None, str | None]:
    m = PROC_RE.match(rest)
    if not m:
        return None, None
    pid = int(m.group(1)) if m.group(1).isdigit() else None
    name = m.group(2)
    if name is not None and (name == "<unknown>" or not name.strip()):
        name = None
    return pid, name


def _stamp(line: str) -> float | None:
    m = STAMP_RE.search(line[:80])
    return float(m.group(1)) if m else None


def parse_kmsg(line: str) -> KmsgLine | None:
    """The XID or bus loss one line (or one whole record) reports, or None."""
    line = line[:MAX_LINE]
    if "NVRM" not in line:
        return None
    m = XID_RE.search(line)
    if m:
        xid, rest = int(m.group(3)), m.group(4) or ""
        pid, name = _proc(rest)
        caused = CAUSED_BY_RE.search(rest)
        return KmsgLine(
            m.group(1),
            xid,
            rest,
            off_bus=xid == 79,
            pid=pid,
            name=name,
            mig=m.group(2).strip(),
            follows_xid=int(caused.group(1)) if caused else None,
            stamp=_stamp(line),
        )
    for regex in (OFF_BUS_DEV_RE, PROBE_RE, OFF_BUS_RE):
        m = regex.search(line)
        if m:
            return KmsgLine(m.group(1), None, BUS_LOSS, off_bus=True, stamp=_stamp(line))
    return None


def parse_kmsg_line(line: str) -> tuple[str, int | None, str] | None:
    """(pci, xid or None for fallen-off-the-bus, rest) or None if the line is not about XIDs."""
    p = parse_kmsg(line)
    return None if p is None or p.pci is None else (p.pci, p.xid, p.text)


def is_unparsed(line: str) -> bool:
    """The line names an XID or a bus loss in a wording none of the patterns know."""
    line = line[:MAX_LINE]
    return (
        MENTIONS_RE.search(line) is not None
        and parse_kmsg(line) is None
        and SXID_RE.search(line) is None
        and PROBE_TAIL_RE.search(line) is None  # the probe record's last line: KmsgReader's
    )


class KmsgReader:
    """Lines in, what they report out; keeps the state a three-line probe-time bus loss needs
    (its first line names the GPU, its last says it was lost) and counts unparsed lines."""

    def __init__(self) -> None:
        self._probe_pci: str | None = None

    def feed(self, line: str) -> list[KmsgLine]:
        out: list[KmsgLine] = []
        stamp = _stamp(line)  # a record's later lines carry no stamp of their own
        # a /dev/kmsg record keeps the driver's newlines (escaped); a log file has one a line
        for part in line.replace("\\x0a", "\n").split("\n"):
            got = self._one(part)
            if got is not None:
                if got.stamp is None and stamp is not None:
                    got = msgspec.structs.replace(got, stamp=stamp)
                out.append(got)
        return out

    def _one(self, line: str) -> KmsgLine | None:
        line = line[:MAX_LINE]
        head = PROBE_HEAD_RE.search(line)
        if head:
            self._probe_pci = head.group(1)
            return None
        if PROBE_TAIL_RE.search(line) and not PROBE_RE.search(line):
            # the GPU named two lines up; None where the log began after it (still a bus loss)
            pci, self._probe_pci = self._probe_pci, None
            return KmsgLine(pci, None, BUS_LOSS, off_bus=True, stamp=_stamp(line))
        parsed = parse_kmsg(line)
        if parsed is None and is_unparsed(line):
            unparsed.note("kmsg", line.strip())
        return parsed


def slurm_job_of(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The Slurm job a process runs in, from its cgroup path (`…/job_<id>/step_…`, the name
    Slurm's cgroup plugins give, v1 and v2), or None (not a job's, or already gone)."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"/job_([0-9]{1,12})(?:/|$)", text, re.MULTILINE)
    return m.group(1) if m else None


CHUNK = 1024 * 1024
# what a line must hold to be read further: every pattern above, and any other mention of an
# XID or a bus loss (the unparsed counter must see those too); "Xid" also finds "SXid"
MARKERS = (b"Xid", b"XID", b"xid", b"fallen off the bus", b"NVRM: The NVIDIA GPU")


def read_log_lines(fh: Any, offset: int, chunk: int = CHUNK) -> tuple[list[str], int]:
    """The XID-related lines of a log file from `offset` to its last complete line, read in
    chunks (memory bounded by one chunk and one line, whatever the log's size) without ever
    splitting a line; returns them and the offset of the first incomplete line (read again
    next time)."""
    fh.seek(offset)
    out: list[str] = []
    carry = b""
    carry_start = offset  # file offset where `carry` begins
    while True:
        data = fh.read(chunk)
        if not data:
            break
        buf = carry + data
        end = buf.rfind(b"\n")
        if end < 0:
            if len(buf) > MAX_LINE:  # longer than any XID line: drop its head, stay bounded
                drop = len(buf) - MAX_LINE
                carry, carry_start = buf[drop:], carry_start + drop
            else:
                carry = buf
            continue
        complete, carry = buf[: end + 1], buf[end + 1 :]
        carry_start += end + 1
        if any(m in complete for m in MARKERS):  # most chunks hold no XID: skip them whole
            for line in complete.splitlines():
                if any(m in line for m in MARKERS):
                    out.append(line.decode("utf-8", "replace"))
    return out, carry_start


def devkmsg_message(rec: bytes) -> str:
    """The message of one /dev/kmsg record (`prio,seq,usec,flags;message\\n KEY=value…`), its
    timestamp put in front as dmesg prints it (`[  usec/1e6]`), for the follow-on window."""
    text = rec.decode("utf-8", "replace")
    header, _, rest = text.partition(";")
    message = rest.split("\n", 1)[0]
    fields = header.split(",")
    if len(fields) >= 3 and fields[2].isdigit():
        return f"[{int(fields[2]) / 1e6:.6f}] {message}"
    return message


def read_devkmsg(f: Any) -> list[str]:
    import os

    fd = f.fileno()
    os.set_blocking(fd, False)
    lines = []
    while True:
        try:
            rec = os.read(fd, 8192)
        except BlockingIOError:
            break
        except OSError:  # EPIPE when records were overwritten; keep reading
            continue
        if not rec:
            break
        lines.append(devkmsg_message(rec))
    return lines
