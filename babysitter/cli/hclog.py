"""The HealthCheckProgram's log: what `babysitter check --slurm-drain` did to its node, and
what it failed to do. Slurm discards the program's stdout and stderr, so these lines also go to
syslog (the journal reads /dev/log) through the standard library's SysLogHandler; where the
socket is absent (a container, a test) they go to stderr only."""

from __future__ import annotations

import logging
import sys
from logging.handlers import SysLogHandler

IDENT = "babysitter-healthcheck: "


def healthcheck_log(socket_path: str) -> logging.Logger:
    log = logging.getLogger("babysitter.healthcheck")
    if log.handlers:  # set up once per process
        return log
    log.setLevel(logging.INFO)
    log.propagate = False  # stderr has its own handler below, whatever -v says
    err = logging.StreamHandler(sys.stderr)
    err.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(err)
    if socket_path:
        sysh = SysLogHandler(address=socket_path, facility=SysLogHandler.LOG_DAEMON)
        # the handler swallows a failed connect and would then print a "Logging error" for
        # every line: use it only when it did connect (no syslog here: stderr only)
        sock = getattr(sysh, "socket", None)
        if sock is not None and sock.fileno() >= 0:
            sysh.ident = IDENT
            sysh.setFormatter(logging.Formatter("%(message)s"))
            log.addHandler(sysh)
        else:
            sysh.close()
    return log
