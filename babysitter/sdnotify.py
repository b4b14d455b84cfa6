"""systemd notify protocol (READY=1, WATCHDOG=1, STATUS=…) over $NOTIFY_SOCKET; a no-op when
not run by systemd. No dependency: it is one datagram."""

from __future__ import annotations

import os
import socket


def notify(*states: str) -> bool:
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):  # abstract namespace
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.settimeout(1.0)
            s.connect(addr)
            s.sendall("\n".join(states).encode())
        return True
    except OSError:
        return False


def watchdog_interval_s() -> float | None:
    """Half of WatchdogSec (systemd's advice), or None when no watchdog is configured."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.5, int(usec) / 1e6 / 2)
    except ValueError:
        return None
