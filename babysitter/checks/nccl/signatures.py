"""NCCL / PyTorch failure signatures of job-log lines.

One failure is rated the same whatever NCCL or PyTorch version printed it: each signature lists
every wording of its failure seen in real logs (tests/data/world/nccl/samples.jsonl), and the
first signature whose pattern matches a line wins. The order puts the most specific cause first,
so a PyTorch watchdog line that names its cause ("watchdog thread terminated with exception:
CUDA error: ...", "... Watchdog caught collective operation timeout") is rated by that cause.

Critical: the job's collectives failed for good (a timeout, the network, a system call, CUDA).
Warning: NCCL reported a problem whose consequence the line does not say (a plain `NCCL WARN`, a
usage or internal error).
"""

from __future__ import annotations

import re

from babysitter.finding import Severity

# libibverbs' ibv_event_type_str() names of the async events that break a queue pair, the port
# or the device; the others (port active, LID/GID/SM change, ...) are informational
_FATAL_IB_EVENTS = (
    r"port error|local catastrophic error|CQ error|local work queue catastrophic error"
    r"|invalid request local work queue error|local access violation work queue error"
    r"|SRQ catastrophic error|WQ fatal"
)

SIGNATURES: list[tuple[str, re.Pattern[str], Severity]] = [
    (
        "nccl.watchdog_timeout",
        re.compile(r"Watchdog caught collective operation timeout"),
        Severity.CRITICAL,
    ),
    # the transport failing under the job. An IB work completion with an error status, in every
    # NCCL wording: "Got completion with error 12, opcode 0" (<= 2.9), "Got completion from peer
    # X with error 4" (2.10-2.18), "... with status=12 opcode=" (2.19-2.27), "NET/IB: ... with
    # status=IBV_WC_RETRY_EXC_ERR(12)" (>= 2.28), plugins' NET/IBP, NET/IB/GIN; error 12 is
    # IBV_WC_RETRY_EXC_ERR, "transport retry counter exceeded" as libibverbs and UCX print it
    (
        "nccl.transport_error",
        re.compile(
            r"NET/IB\w*(?:/\w+)?\s*:.*?Got (?:completion|CQE)\b.*?\bwith (?:error|status)"
            r"|(?i:transport retry count(?:er)? exceeded)"
            r"|NET/IB\s*:.*async fatal event"
            rf"|NET/IB\s*:.*Got (?:non-fatal )?async event\s*:\s*(?:{_FATAL_IB_EVENTS})"
            r"|NET/OFI .*completed with error"
        ),
        Severity.CRITICAL,
    ),
    # ncclRemoteError (NCCL >= 2.13.4) and the socket failures behind it; before 2.13.4 the same
    # failures returned ncclSystemError, "unhandled system error", rated alike below
    (
        "nccl.remote_error",
        re.compile(
            r"remote process exited or there was a network error|ncclRemoteError"
            r"|NCCL WARN .*(?:Connection reset by peer|Connection closed by remote peer"
            r"|Broken pipe|Connection refused|Software caused connection abort|No route to host)"
            r"|\bsocket\w*: Call to \w+ .* failed : "
        ),
        Severity.CRITICAL,
    ),
    (
        "nccl.unhandled_system_error",
        re.compile(r"unhandled system error|ncclSystemError"),
        Severity.CRITICAL,
    ),
    # "Cuda failure" is NCCL's own wording (CUDA's is "CUDA error"); PyTorch's watchdog dying of
    # a CUDA error is the same failure seen from above
    (
        "nccl.cuda_error",
        re.compile(
            r"(?i:unhandled cuda error)|ncclUnhandledCudaError|\bCuda failure (?:\d+ )?'"
            r"|watchdog thread terminated with exception: CUDA error"
        ),
        Severity.CRITICAL,
    ),
    # PyTorch's watchdog took the process down for a cause none of the above names
    (
        "nccl.watchdog_exception",
        re.compile(r"watchdog thread terminated with exception"),
        Severity.CRITICAL,
    ),
    # PyTorch's process-group timeouts and hangs, in their wordings across versions; not NCCL's
    # INFO "connect returned Connection timed out, retrying", which is NCCL retrying
    (
        "nccl.pg_timeout",
        re.compile(
            r"ProcessGroupNCCL.*\b[Tt]imeout\b|Some NCCL operations have failed or timed out"
            r"|Heartbeat monitor timed out|watchdog got stuck|NCCL monitor thread timeout"
            r"|monitor thread terminated with timeout"
        ),
        Severity.CRITICAL,
    ),
    (
        "nccl.error",
        re.compile(r"(?i:NCCL error)|ncclInternalError|ncclInvalid\w+|Test NCCL failure"),
        Severity.WARNING,
    ),
    ("nccl.warn", re.compile(r"NCCL WARN"), Severity.WARNING),
]

# A line that names an NCCL failure in a wording no signature knows: it says NCCL (its own
# prefix, a PyTorch NCCL class, an ncclResult name) and a failure word as a whole word (so
# NCCL_ASYNC_ERROR_HANDLING or checkTimeout are not), and it is not at an INFO level (NCCL's
# "NCCL INFO", glog's "I0527"/"[I ..."), where NCCL prints probing ("Failed to find
# ncclNetPlugin_v6 symbol") and retries, never its failures.
_NAMES_NCCL = re.compile(r"\bNCCL\b|ProcessGroupNCCL|\bnccl[A-Z]\w*")
_FAILURE_WORD = re.compile(
    r"\b(?:error|errors|fail|failed|failure|abort|aborted|aborting|timeout|timed out)\b",
    re.IGNORECASE,
)
_INFO_LEVEL = re.compile(r"\bNCCL INFO\b|(?:^|\]:)\[I[\d ]|^I\d{4}")


def match_line(line: str) -> tuple[str, Severity] | None:
    """(code, severity) of the first signature `line` matches, None if it matches none."""
    for code, pat, sev in SIGNATURES:
        if pat.search(line):
            return code, sev
    return None


def names_nccl_failure(line: str) -> bool:
    """True when `line`, matching no signature, still names an NCCL failure (module doc)."""
    return (
        bool(_NAMES_NCCL.search(line))
        and bool(_FAILURE_WORD.search(line))
        and not _INFO_LEVEL.search(line)
    )
