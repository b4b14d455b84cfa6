"""InfiniBand ports from sysfs: expected ports up at the expected rate, error counters as
deltas (fatal-on-increase and per-time rates), link drops and flaps with a sticky window.

Thresholds (domain notes: gpud, NVSentinel): excessive_buffer_overrun_errors and
local_link_integrity_errors are fatal on any increase; symbol_error > 120/h,
link_error_recovery > 5/min, port_rcv_errors > 10/s, port_xmit_discards > 100/s.

A port that is not ACTIVE is held for `port_down_hold_s` (NCCL's IB retry budget at its
defaults, settings.py): back within it, it was a flap a running job's NCCL rode out, and the
finding is a warning; still down when it ends, `ib.port_down` is critical and drains. A
`link_downed` increase is a flap too (the link retrained, perhaps between two state reads):
the flap the state reads saw already, or one more. `flap_count` flaps within `flap_window_s`
make the port `ib.port_flapping` (critical, naming the port and its cable), sticky for 10 min
(unless the opt-in recovery window says it has been stable long enough).
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from babysitter.checks.base import Check
from babysitter.checks.infiniband.settings import InfinibandCheckConfig
from babysitter.checks.infiniband.tiers import SIGNALS
from babysitter.finding import Action, Finding, Severity

FATAL_ON_INCREASE = (
    "excessive_buffer_overrun_errors",
    "local_link_integrity_errors",
)
RATE_LIMITS: dict[str, float] = {  # counter -> max increase per second
    "symbol_error": 120 / 3600,
    "link_error_recovery": 5 / 60,
    "port_rcv_errors": 10.0,
    "port_xmit_discards": 100.0,
}
FLAP_COUNTER = "link_downed"  # one more each time the link went down (a flap)
STICKY_S = 600.0
_COUNTERS = (FLAP_COUNTER, *FATAL_ON_INCREASE, *RATE_LIMITS)  # the order they are read in


def _read(p: Path) -> str | None:
    try:
        return p.read_text(errors="replace").strip()[:200]
    except OSError:
        return None


_LID = re.compile(r"^0x[0-9a-fA-F]{1,4}$")
_GID = re.compile(r"^(?:[0-9a-fA-F]{4}:){7}[0-9a-fA-F]{4}$")


def fabric_address(port_dir: str) -> dict[str, str]:
    """Where a port sits in the fabric, as far as sysfs tells (read only for a port that is
    down): its LID, its subnet manager's LID and its port GUID (the low half of GID 0). The
    controller shows them in a switch incident; Slurm's topology places the node."""
    out: dict[str, str] = {}
    for key in ("lid", "sm_lid"):
        v = _read_small(f"{port_dir}/{key}")
        if v and _LID.match(v):
            out[key] = v.lower()
    gid = _read_small(f"{port_dir}/gids/0")
    if gid and _GID.match(gid):
        out["port_guid"] = "0x" + gid.replace(":", "")[16:].lower()
    return out


def _read_small(path: str) -> str | None:
    """One small sysfs file (fast tier: plain os calls, no Path objects)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 200).decode(errors="replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_state(text: str | None) -> str:
    """'4: ACTIVE' -> 'ACTIVE'; garbage -> 'UNKNOWN'."""
    if not text:
        return "UNKNOWN"
    m = re.match(r"^\s*\d+\s*:\s*([A-Za-z_]+)", text)
    return m.group(1).upper() if m else "UNKNOWN"


def parse_rate(text: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0"""
    if not text:
        return None
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec", text)
    return float(m.group(1)) if m else None


def parse_counter(text: str | None) -> int | None:
    if text is None or not text.isdigit():
        return None
    return int(text)


class PortState(msgspec.Struct):
    counters: dict[str, int] = msgspec.field(default_factory=dict)
    at: float = 0.0
    up: bool = True
    flaps: list[float] = msgspec.field(default_factory=list)
    unhealthy_until: float = 0.0
    last_change: float = 0.0
    seen: bool = False  # the state was read once: a port down then has a known start
    down_since: float = 0.0
    downs: int = 0  # down transitions the state reads saw since the last counter read


class InfinibandCheck(Check):
    name = "ib.ports"
    signals = SIGNALS
    section = "infiniband"
    interval_s = 30.0
    timeout_s = 10.0

    def __init__(self, *a: Any, clock: Callable[[], float] | None = None, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.clock = clock or time.monotonic
        self.ports: dict[str, PortState] = {}
        self._found: list[tuple[str, int, Path]] | None = None
        self._rates: list[float | None] = []

    @property
    def cfg(self) -> InfinibandCheckConfig:
        return self.ctx.config.checks.infiniband

    @property
    def root(self) -> Path:
        return Path(self.ctx.config.agent.sysfs_root) / "sys" / "class" / "infiniband"

    def supported(self) -> bool:
        if self.root.is_dir():
            return True
        # no IB device: a fault only if the config promises a fabric (checks/profile.py)
        e = self.ctx.expect()
        return e.ib_required and e.ib_ports > 0

    def expected(self) -> tuple[int, float | None]:
        e = self.ctx.expect()
        return e.ib_ports, e.ib_rate_gbps

    def _ports(self) -> list[tuple[str, int, Path]]:
        found: list[tuple[str, int, Path]] = []
        if self.root.is_dir():
            for dev in sorted(self.root.iterdir()):
                pdir = dev / "ports"
                if not pdir.is_dir():
                    continue
                for p in sorted(pdir.iterdir(), key=lambda x: x.name):
                    if p.name.isdigit():
                        found.append((dev.name, int(p.name), p))
        return found

    def run(self) -> list[Finding]:
        now = self.clock()
        due = self.begin(now)
        want_ports, want_rate = self.expected()
        out: list[Finding] = []
        if "counters" in due or self._found is None:
            # the port list changes only with hardware or a driver reload: slow tier
            self._found = self._ports()
            self._rates = [parse_rate(_read(pd / "rate")) for _, _, pd in self._found]
        found, rates = self._found, self._rates
        best = max((r for r in rates if r), default=None)
        active = 0
        for (dev_name, port, pd), rate in zip(found, rates, strict=True):
            comp = f"ib:{dev_name}/{port}"
            st = self.ports.setdefault(comp, PortState(at=now, last_change=now))
            if "state" in due:
                self.keep("state", comp, self._state(comp, pd, st, now))
            if "counters" in due:
                self.keep("counters", comp, self._slow(comp, pd, st, rate, want_rate or best, now))
            if st.up:
                active += 1
            out.extend(
                self.kept(comp)
                or [self.steady_ok(comp, "ib.ok", f"{comp} ACTIVE at {rate or '?'} Gb/s")]
            )
        if want_ports and active < want_ports:
            out.append(
                self.finding(
                    "host",
                    Severity.CRITICAL if not found else Severity.WARNING,
                    "ib.missing" if not found else "ib.ports_below_expected",
                    f"{active} InfiniBand ports ACTIVE, {want_ports} expected"
                    + ("" if found else f" (no devices under {self.root})"),
                    Action.DRAIN if not found else Action.INSPECT,
                    active=active,
                    expected=want_ports,
                )
            )
        return out

    def _state(self, comp: str, p: Path, st: PortState, now: float) -> list[Finding]:
        """Fast tier: state + phys_state, link drops and flaps."""
        out: list[Finding] = []
        base = str(p)
        state = parse_state(_read_small(base + "/state"))
        up = state == "ACTIVE"
        hold = self.cfg.port_down_hold_s
        if not st.seen:
            # down at the first read: since when is unknown (an agent restarted under a dead
            # port), so no flap to wait for
            st.seen, st.up, st.down_since = True, up, -math.inf
            st.downs += not up
        if up != st.up:
            st.last_change = now
            if not up:
                st.down_since = now
                st.downs += 1
            elif now - st.down_since < hold:  # back within the hold: a flap
                self._flapped(st, now, 1)
            st.up = up
        if not up:
            # phys_state only explains a port that is down: read it only then (this runs for
            # every port every second)
            phys = parse_state(_read_small(base + "/phys_state"))
            out.append(self._down(comp, base, state, phys, now - st.down_since))
        recovery = self.cfg.flap_recovery_s
        if st.unhealthy_until > now and recovery and up and now - st.last_change >= recovery:
            st.unhealthy_until = 0.0  # opt-in: stable long enough, forgive the flaps
        if st.unhealthy_until > now:
            out.append(self._flapping(comp, base, st, now))
        return out

    def _flapped(self, st: PortState, now: float, n: int) -> None:
        """`n` flaps now: flap_count of them within flap_window_s make the port unhealthy."""
        window = self.cfg.flap_window_s
        st.flaps = [t for t in st.flaps if now - t <= window] + [now] * n
        if len(st.flaps) >= self.cfg.flap_count:
            st.unhealthy_until = now + STICKY_S

    def _down(self, comp: str, base: str, state: str, phys: str, for_s: float) -> Finding:
        hold = self.cfg.port_down_hold_s
        where = fabric_address(base)
        if for_s >= hold:
            return self.finding(
                comp,
                Severity.CRITICAL,
                "ib.port_down",
                f"{comp} is {state} (physical {phys})",
                Action.DRAIN,
                state=state,
                phys_state=phys,
                **where,
            )
        # within NCCL's retry budget: a running job still rides it out. The message stays the
        # same while it lasts (no new finding each second)
        return self.finding(
            comp,
            Severity.WARNING,
            "ib.port_down",
            f"{comp} is {state} (physical {phys}): a flap if back within {hold:g} s "
            "(NCCL's IB retry budget), drained after",
            Action.WATCH,
            state=state,
            phys_state=phys,
            hold_s=hold,
            **where,
        )

    def _flapping(self, comp: str, base: str, st: PortState, now: float) -> Finding:
        where = fabric_address(base) | cable(base)
        dev, _, port = comp.removeprefix("ib:").partition("/")
        at = ", ".join(f"{k} {v}" for k, v in where.items())
        window = self.cfg.flap_window_s
        return self.finding(
            comp,
            Severity.CRITICAL,
            "ib.port_flapping",
            f"{comp} flapped {len(st.flaps)} times in {window / 60:g} min: check the cable "
            f"at {dev} port {port}" + (f" ({at})" if at else ""),
            Action.DRAIN,
            flaps=len(st.flaps),
            window_s=window,
            sticky_for_s=round(st.unhealthy_until - now),
            **where,
        )

    def _slow(
        self,
        comp: str,
        p: Path,
        st: PortState,
        rate: float | None,
        want_rate: float | None,
        now: float,
    ) -> list[Finding]:
        """Slow tier: the link rate and the error counters."""
        out: list[Finding] = []
        if st.up and want_rate and rate is not None and rate < want_rate:
            out.append(
                self.finding(
                    comp,
                    Severity.WARNING,
                    "ib.rate_degraded",
                    f"{comp} at {rate:g} Gb/s, {want_rate:g} expected",
                    Action.INSPECT,
                    rate_gbps=rate,
                    expected_gbps=want_rate,
                )
            )
        out.extend(self._counters(comp, f"{p}/counters/", st, now))
        return out

    def _counters(self, comp: str, cdir: str, st: PortState, now: float) -> list[Finding]:
        out: list[Finding] = []
        current: dict[str, int] = {}
        for n in _COUNTERS:
            # plain os reads, no Path per file: 7 counters per port on every slow-tier run
            v = parse_counter(_read_small(cdir + n))
            if v is not None:
                current[n] = v
        dt = max(now - st.at, 1e-6)
        seen, st.downs = st.downs, 0
        if st.counters:
            for n, v in current.items():
                prev = st.counters.get(n)
                if prev is None:
                    continue
                delta = v - prev if v >= prev else v  # reset or wrap: count from zero
                if delta <= 0:
                    continue
                if n == FLAP_COUNTER:
                    out.append(self._link_downed(comp, st, delta, seen, now))
                elif n in FATAL_ON_INCREASE:
                    out.append(
                        self.finding(
                            comp,
                            Severity.CRITICAL,
                            f"ib.{n}",
                            f"{comp} {n} increased by {delta}",
                            Action.DRAIN,
                            counter=n,
                            delta=delta,
                        )
                    )
                elif delta / dt > RATE_LIMITS[n]:
                    out.append(
                        self.finding(
                            comp,
                            Severity.WARNING,
                            f"ib.{n}",
                            f"{comp} {n} +{delta} in {dt:.0f} s",
                            Action.WATCH,
                            counter=n,
                            delta=delta,
                            per_s=round(delta / dt, 4),
                        )
                    )
        st.counters = current
        st.at = now
        return out

    def _link_downed(self, comp: str, st: PortState, delta: int, seen: int, now: float) -> Finding:
        """The link went down `delta` times since the last counter read: the state reads saw
        `seen` of those go down (their flap, or their drain, is theirs); the rest were too short
        for them and are flaps of their own. A warning: the flap rule drains, not one retrain."""
        if delta > seen:
            self._flapped(st, now, delta - seen)
        return self.finding(
            comp,
            Severity.WARNING,
            f"ib.{FLAP_COUNTER}",
            f"{comp} {FLAP_COUNTER} increased by {delta} (the link retrained: a flap)",
            Action.WATCH,
            counter=FLAP_COUNTER,
            delta=delta,
        )


def cable(port_dir: str) -> dict[str, str]:
    """Where the port's cable starts, for the technician: the HCA's PCI address (the card's
    slot; with the device and port, the cable is the one in that port). The switch end is the
    subnet manager's to tell (ibnetdiscover), from the port GUID."""
    out: dict[str, str] = {}
    dev = os.path.dirname(os.path.dirname(port_dir))
    try:
        out["pci"] = os.path.basename(os.path.realpath(dev + "/device"))[:32]
    except OSError:
        pass
    if not _PCI.match(out.get("pci", "")):
        out.pop("pci", None)
    return out


_PCI = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
