"""What every backend shares: argument validation, the ownership rules, scontrol as the
universal fallback for changes, and turning Slurm's messages into typed errors."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from babysitter.slurm import expedite
from babysitter.slurm.client import (
    SlurmBusy,
    SlurmClient,
    SlurmError,
    SlurmNode,
    SlurmNodeSettling,
    SlurmNotFound,
    SlurmNotOwned,
    SlurmRejected,
    SlurmUnavailable,
)
from babysitter.slurm.hostlist import expand
from babysitter.slurm.ownership import ReasonOwner, mark_owner, may_change, reason_owner
from babysitter.slurm.topology import NO_TOPOLOGY, Topology, parse_topology

log = logging.getLogger(__name__)
T = TypeVar("T")

_NODE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_REASON = 200  # Slurm keeps longer reasons, but sinfo/squeue columns and humans do not
# nodes per `scontrol update NodeName=a,b,c`: one RPC each; keeps argv far below ARG_MAX
BATCH = 500

_UNAVAILABLE = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "zero bytes were transmitted",
    "communication connection failure",
    "slurm_persist_conn_open",
    "could not establish a configuration source",
    # `sinfo/squeue --json` (22.05) say only this when slurmctld is down
    "unspecified error (-1)",
)
_NOT_FOUND = (
    "invalid job id",
    "invalid node name",
    "node not found",
    "unknown node",
    "requested reservation is invalid",  # no such reservation (22.05 and later)
)
# a reservation (without IGNORE_JOBS) that would overlap a running job
_BUSY = "requested nodes are busy"


# words Slurm reads as something other than one node wherever a node list goes (`Nodes=ALL`,
# `NodeName=DEFAULT`, `None`), compared without case as Slurm does: never a node name here
SLURM_KEYWORDS = frozenset({"all", "default", "none"})


def node_name_problem(name: str) -> str | None:
    """Why `name` cannot be a node's name in babysitter (None: it can)."""
    if not isinstance(name, str) or not _NODE_RE.match(name):
        return "not a node name (letters, digits, '.', '_', '-'; up to 64)"
    if name.lower() in SLURM_KEYWORDS:
        return f"{name!r} is a Slurm keyword, not a node name"
    return None


def validate_node(name: str) -> str:
    if node_name_problem(name) is not None:
        raise SlurmRejected(f"invalid node name {name!r}")
    return name


def validate_job_id(job_id: int | str) -> int:
    try:
        jid = int(str(job_id).split("_")[0])
    except ValueError:
        raise SlurmRejected(f"invalid job id {job_id!r}") from None
    if jid <= 0:
        raise SlurmRejected(f"invalid job id {job_id!r}")
    return jid


def clean_reason(reason: str) -> str:
    """One printable line; Slurm shows reasons in fixed columns and logs."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in reason).split())
    if not flat:
        raise SlurmRejected("a drain needs a reason")
    return flat


def parsed(fn: Callable[[dict[str, Any]], T], doc: dict[str, Any], what: str) -> T:
    """Parse Slurm output; malformed output is a SlurmError, never a crash."""
    try:
        return fn(doc)
    except ValueError as exc:
        raise SlurmError(f"{what}: {exc}") from None


def classify(message: str, what: str) -> SlurmError:
    low = message.lower()
    if any(s in low for s in _UNAVAILABLE):
        return SlurmUnavailable(f"{what}: Slurm unavailable: {message}", message)
    if any(s in low for s in _NOT_FOUND) or re.search(r"\bnode \S+ not found", low):
        return SlurmNotFound(f"{what}: {message}", message)
    if _BUSY in low:
        return SlurmBusy(f"{what}: {message}", message)
    return SlurmRejected(f"{what}: {message}", message)


class Scontrol:
    """Runs Slurm client commands (argv, never a shell) with a timeout."""

    def __init__(
        self,
        slurm_conf: Path | None = None,
        bin_dir: Path | None = None,
        timeout_s: float = 15.0,
    ) -> None:
        self.slurm_conf = slurm_conf
        self.bin_dir = bin_dir
        self.timeout_s = timeout_s

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def prog(self, name: str) -> str:
        if self.bin_dir:
            return str(self.bin_dir / name)
        return name

    def run(self, prog: str, *args: str, what: str = "", partial_ok: bool = False) -> str:
        """stdout of a successful run. `partial_ok`: a failed run that still printed something
        (`scontrol show node -o a,bogus` prints a and exits 1) returns what it printed."""
        argv = [self.prog(prog), *args]
        what = what or " ".join(argv[:3])
        try:
            # errors="replace": a job name or path that is not UTF-8 (a path may hold any
            # bytes) reads as U+FFFD instead of failing the listing of every job
            r = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout_s,
                env=self.env(),
            )
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{what}: no answer within {self.timeout_s:g} s") from None
        except FileNotFoundError:
            raise SlurmUnavailable(f"{what}: {argv[0]} not found (is Slurm installed?)") from None
        if r.returncode != 0 and partial_ok and r.stdout.strip():
            return r.stdout
        if r.returncode != 0:
            msg = (r.stderr or r.stdout).strip()
            msg = re.sub(r"^(scontrol|sinfo|squeue|scancel): (error: )?", "", msg, flags=re.M)
            raise classify(" ".join(msg.split()) or f"exit {r.returncode}", what)
        return r.stdout

    # changes every backend may need
    def drain(self, node: str, reason: str) -> None:
        self.run(
            "scontrol",
            "update",
            f"NodeName={node}",
            "State=DRAIN",
            f"Reason={reason}",
            what=f"drain {node}",
        )

    def resume(self, node: str) -> None:
        self.run("scontrol", "update", f"NodeName={node}", "State=RESUME", what=f"resume {node}")

    def requeue(self, job_id: int, hold: bool) -> None:
        self.run(
            "scontrol",
            "requeuehold" if hold else "requeue",
            str(job_id),
            what=f"requeue {job_id}",
        )

    def exclude(self, job_id: int, nodes: list[str]) -> None:
        self.run(
            "scontrol",
            "update",
            f"JobId={job_id}",
            f"ExcNodeList={','.join(nodes)}",
            what=f"exclude nodes for {job_id}",
        )

    def hold(self, job_id: int) -> None:
        self.run("scontrol", "hold", str(job_id), what=f"hold {job_id}")

    def release(self, job_id: int) -> None:
        self.run("scontrol", "release", str(job_id), what=f"release {job_id}")

    # validation jobs: a MAINT reservation on one node, a job inside it, its outcome
    def create_reservation(
        self, name: str, node: str, user: str, minutes: int, exist_ok: bool = False
    ) -> None:
        """A MAINT reservation starting now; `node` may be a comma-separated list."""
        if exist_ok and self.has_reservation(name):
            return
        self.run(
            "scontrol",
            "create",
            "reservation",
            f"ReservationName={name}",
            f"Nodes={node}",
            f"Users={user}",
            "StartTime=now",
            f"Duration={minutes}",
            "Flags=MAINT,IGNORE_JOBS",
            what=f"reserve {node}",
        )

    def has_reservation(self, name: str) -> bool:
        try:
            self.run("scontrol", "show", "reservation", name, what=f"show reservation {name}")
        except (SlurmNotFound, SlurmRejected) as exc:
            if "not found" in exc.slurm_message.lower() or isinstance(exc, SlurmNotFound):
                return False
            raise
        return True

    def delete_reservation(self, name: str) -> None:
        try:
            self.run("scontrol", "delete", f"ReservationName={name}", what=f"unreserve {name}")
        except SlurmNotFound:
            pass  # already gone (expired, or deleted by an admin)

    def reboot(self, node: str, reason: str, nextstate: str) -> None:
        self.run(
            "scontrol",
            "reboot",
            "ASAP",
            f"nextstate={nextstate}",
            f"reason={reason}",
            node,
            what=f"reboot {node}",
        )

    def cancel_reboot(self, node: str) -> None:
        self.run("scontrol", "cancel_reboot", node, what=f"cancel reboot {node}")

    def cancel_job(self, job_id: int) -> None:
        try:
            self.run("scancel", str(job_id), what=f"cancel job {job_id}")
        except SlurmRejected as exc:
            if "already completing or completed" not in exc.slurm_message.lower():
                raise  # ended already: nothing left to cancel

    def config_value(self, key: str) -> str:
        """One `scontrol show config` value ("" for `(null)` or absent)."""
        out = self.run("scontrol", "show", "config", what="show config")
        m = re.search(rf"^{re.escape(key)}\s*=\s*(.*)$", out, flags=re.M)
        value = m.group(1).strip() if m else ""
        return "" if value in ("(null)", "") else value

    def hold_idle(self, name: str, nodes: list[str], user: str, minutes: int) -> None:
        """No IGNORE_JOBS: slurmctld refuses ("Requested nodes are busy") if a job holds any
        of the nodes (checked on 22.05, with or without MAINT)."""
        self.run(
            "scontrol",
            "create",
            "reservation",
            f"ReservationName={name}",
            f"Nodes={','.join(nodes)}",
            f"Users={user}",
            "StartTime=now",
            f"Duration={minutes}",
            what=f"hold {name}",
        )

    def shrink_hold(self, name: str, nodes: list[str]) -> None:
        self.run(
            "scontrol",
            "update",
            f"ReservationName={name}",
            f"Nodes={','.join(nodes)}",
            what=f"shrink hold {name}",
        )

    def reservations(self) -> dict[str, tuple[str, ...]]:
        """Every reservation and its nodes (`scontrol show reservation -o`, one RPC)."""
        out = self.run("scontrol", "show", "reservation", "-o", what="list reservations")
        found: dict[str, tuple[str, ...]] = {}
        for line in out.splitlines():
            name = re.search(r"\bReservationName=(\S+)", line)
            if name is None:
                continue  # "No reservations in the system"
            nodes = re.search(r"\bNodes=(\S+)", line)
            try:
                found[name.group(1)] = tuple(expand(nodes.group(1) if nodes else ""))
            except ValueError as exc:
                raise SlurmError(f"list reservations: {exc}") from None
        return found

    def sbatch(self, args: list[str]) -> int:
        out = self.run("sbatch", "--parsable", *args, what="sbatch")
        return validate_job_id(out.strip().split(";", 1)[0])

    def job_outcome(self, job_id: int) -> tuple[str, str]:
        """(JobState, ExitCode) of a job slurmctld still remembers (MinJobAge)."""
        out = self.run("scontrol", "show", "job", "-o", str(job_id), what=f"show job {job_id}")
        state = re.search(r"\bJobState=(\S+)", out)
        code = re.search(r"\bExitCode=(\S+)", out)
        return (state.group(1) if state else "UNKNOWN", code.group(1) if code else "")


class OwnedClient(SlurmClient):
    """Ownership rules (NHC's) on top of a backend's reads and `_set_*` writes. Writes go
    through scontrol unless a backend has a better way (REST on newer Slurm)."""

    def __init__(
        self,
        reason_prefix: str = "babysitter:",
        slurm_conf: Path | None = None,
        bin_dir: Path | None = None,
        timeout_s: float = 15.0,
    ) -> None:
        self.reason_prefix = reason_prefix
        self.sc = Scontrol(slurm_conf, bin_dir, timeout_s)

    def nodes_named(self, names: Sequence[str]) -> dict[str, SlurmNode]:
        """Fresh state of exactly these nodes in one Slurm call; unknown names are left out.
        Default: the full listing (22.05's REST /node/{name} answers for unknown names too,
        and sinfo --json ignores -n there)."""
        wanted = set(names)
        return {n.name: n for n in self.nodes() if n.name in wanted}

    def node(self, name: str) -> SlurmNode:
        validate_node(name)
        got = self.nodes_named([name]).get(name)
        if got is None:
            raise SlurmNotFound(f"unknown node {name}")
        return got

    @cached_property
    def controller_version(self) -> tuple[int, int]:
        """slurmctld's version (read once: what it can do decides how babysitter requeues)."""
        return expedite.controller_version(self)

    def topology(self) -> Topology:
        """`scontrol show topology`: the same text on every supported version and backend
        (slurmrestd has no topology endpoint before v0.0.42)."""
        try:
            text = self.sc.run("scontrol", "show", "topology", what="scontrol show topology")
        except SlurmRejected as exc:
            if NO_TOPOLOGY in str(exc).lower():
                return Topology()
            raise
        return parse_topology(text)

    def owns(self, node: SlurmNode, manual: bool = False, actor: ReasonOwner | None = None) -> bool:
        """The node's reason is this client's to change (slurm/ownership.py): the reason its
        own mode wrote (`acting_as`: the controller's automation, or the HealthCheckProgram's),
        or with `manual` (an admin's request through babysitter) any reason babysitter wrote."""
        who = actor or (ReasonOwner.MANUAL if manual else self.acting_as)
        return may_change(reason_owner(node.reason, self.reason_prefix), who)

    def full_reason(self, reason: str) -> str:
        text = f"{self.reason_prefix} {clean_reason(reason)}"
        return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"

    def drain(self, node: str, reason: str) -> None:
        validate_node(node)
        err = self.drain_many([node], reason)[node]
        if err is not None:
            raise err

    def resume(self, node: str, manual: bool = False) -> None:
        validate_node(node)
        err = self.resume_many([node], manual)[node]
        if err is not None:
            raise err

    def _current(
        self, nodes: Sequence[str], out: dict[str, SlurmError | None]
    ) -> dict[str, SlurmNode]:
        """Ownership is re-checked right before the change, for exactly the nodes it touches,
        in one lookup (a snapshot from earlier in the tick may be stale by then). Invalid or
        unknown names and a failed lookup land in `out`."""
        names = []
        for n in nodes:
            try:
                names.append(validate_node(n))
            except SlurmRejected as exc:
                out[n] = exc
        if not names:
            return {}
        try:
            current = self.nodes_named(names)
        except SlurmError as exc:
            out.update({n: exc for n in names})
            return {}
        for n in names:
            if n not in current:
                out[n] = SlurmNotFound(f"unknown node {n}")
        return current

    def _batched(
        self,
        todo: list[str],
        change: Callable[[list[str]], None],
        out: dict[str, SlurmError | None],
    ) -> None:
        for k in range(0, len(todo), BATCH):
            chunk = todo[k : k + BATCH]
            try:
                change(chunk)
                out.update({n: None for n in chunk})
            except SlurmError as exc:
                out.update({n: exc for n in chunk})

    def drain_many(self, nodes: Sequence[str], reason: str) -> dict[str, SlurmError | None]:
        full = self.full_reason(reason)
        # a marked drain is its mark's (an admin's may re-reason an admin's drain, the check's
        # the check's); an automatic one re-reasons only babysitter's automatic reasons
        actor = mark_owner(clean_reason(reason)) or self.acting_as
        out: dict[str, SlurmError | None] = {}
        todo = []
        for name, cur in self._current(nodes, out).items():
            if cur.reason and not self.owns(cur, actor=actor):
                out[name] = SlurmNotOwned(
                    f"{name} already has a reason that is not babysitter's "
                    f"({cur.reason!r}); leaving it alone",
                    cur.reason,
                )
            else:
                todo.append(name)
        self._batched(todo, lambda chunk: self._set_drain_many(chunk, full), out)
        return out

    def resume_many(
        self, nodes: Sequence[str], manual: bool = False
    ) -> dict[str, SlurmError | None]:
        out: dict[str, SlurmError | None] = {}
        todo = []
        for name, cur in self._current(nodes, out).items():
            if not cur.reason and not cur.drained_or_draining and not cur.down:
                out[name] = None  # nothing to resume
            elif not self.owns(cur, manual):
                out[name] = SlurmNotOwned(
                    f"refusing to resume {name}: its reason {cur.reason!r} is not "
                    f"babysitter's (prefix {self.reason_prefix!r})",
                    cur.reason,
                )
            else:
                todo.append(name)
        self._batched(todo, self._set_resume_many, out)
        return out

    def requeue(self, job_id: int, exclude: list[str] | None = None, hold: bool = False) -> None:
        jid = validate_job_id(job_id)
        exclude = [validate_node(n) for n in exclude or []]
        before = self.job(jid)
        # off nodes it drained for a fault, a job submitted with --requeue=expedite gets Slurm
        # 25.11's expedited requeue (slurm/expedite.py); everything else the plain one
        if hold or not expedite.requeue_expedited(self, before, exclude):
            self._set_requeue(jid, hold)
        if exclude:
            merged = sorted(set(before.excluded_nodes) | set(exclude))
            # ExcNodeList can only change while the job is pending; right after a requeue the
            # job is PENDING(+COMPLETING), retry briefly if Slurm has not caught up yet.
            deadline = time.monotonic() + 10
            while True:
                try:
                    self._set_exclude(jid, merged)
                    return
                except SlurmRejected as exc:
                    # 25.11+ may start it again at once (expedited, or any requeue of a job
                    # submitted with --requeue=expedite): fine while off the faulty nodes
                    if expedite.restarted_elsewhere(self, jid, exclude):
                        return
                    if time.monotonic() > deadline or "pending" not in exc.slurm_message.lower():
                        raise
                    time.sleep(0.3)

    # backend hooks (scontrol by default)
    def _set_drain(self, node: str, reason: str) -> None:
        self.sc.drain(node, reason)

    def _set_resume(self, node: str) -> None:
        self.sc.resume(node)

    def _set_drain_many(self, nodes: list[str], reason: str) -> None:
        """One `scontrol update NodeName=a,b,c`: one RPC, and Slurm applies it to all or none
        (an unknown name fails the whole call, which is why names are checked first)."""
        if type(self)._set_drain is not OwnedClient._set_drain:  # a backend's own way (pyslurm)
            for n in nodes:
                self._set_drain(n, reason)
        elif len(nodes) == 1:
            self._set_drain(nodes[0], reason)
        else:
            self.sc.drain(",".join(nodes), reason)

    def _set_resume_many(self, nodes: list[str]) -> None:
        if type(self)._set_resume is not OwnedClient._set_resume:
            for n in nodes:
                self._set_resume(n)
        elif len(nodes) == 1:
            self._set_resume(nodes[0])
        else:
            self.sc.resume(",".join(nodes))

    def _set_requeue(self, job_id: int, hold: bool) -> None:
        self.sc.requeue(job_id, hold)

    def _set_exclude(self, job_id: int, nodes: list[str]) -> None:
        self.sc.exclude(job_id, nodes)

    def hold(self, job_id: int) -> None:
        self.sc.hold(validate_job_id(job_id))

    def release(self, job_id: int) -> None:
        self.sc.release(validate_job_id(job_id))

    def start_validation(
        self, node: str, reservation: str, user: str, minutes: int, sbatch_args: list[str]
    ) -> int:
        """Reserve NODE (MAINT: nothing but the validation job may start there), return it to
        Slurm inside the reservation and submit the job. The reservation exists before the
        node is resumed, so no user job can slip in."""
        validate_node(node)
        # a reboot made it already (hold_for_validation): the job runs in that one
        self.sc.create_reservation(reservation, node, user, minutes, exist_ok=True)
        try:
            cur = self.node(node)
            # back from a reboot, Slurm may have returned it already (25.11: IDLE+MAINT in the
            # reservation), and refuses to resume a node that is neither drained nor down
            if cur.drained_or_draining or cur.down:
                self._resume_for_validation(node)
            return self.sc.sbatch(
                [f"--reservation={reservation}", f"--nodelist={node}", *sbatch_args]
            )
        except SlurmNodeSettling:
            raise  # the reservation stays for the next try: the node is drained meanwhile
        except SlurmError:
            self.sc.delete_reservation(reservation)
            raise

    def _resume_for_validation(self, node: str) -> None:
        """Resume NODE into its reservation. Back from a reboot, its state moves under us:
        Slurm may return it itself between the read and the resume, or refuse the resume while
        the reboot is still settling ("Invalid node state specified", seen in cold runs)."""
        try:
            self.resume(node)
        except SlurmRejected as exc:
            now = self.node(node)
            if not (now.drained_or_draining or now.down):
                return  # Slurm returned it meanwhile: in the reservation, as wanted
            raise SlurmNodeSettling(
                f"Slurm will not return {node} yet ({now.state}): {exc}", exc.slurm_message
            ) from exc

    def validation_outcome(self, job_id: int) -> tuple[str, str]:
        return self.sc.job_outcome(validate_job_id(job_id))

    def end_validation(self, reservation: str) -> None:
        self.sc.delete_reservation(reservation)

    def reboot(self, node: str, reason: str, nextstate: str) -> None:
        validate_node(node)
        cur = self.node(node)
        if cur.reason and not self.owns(cur):
            raise SlurmNotOwned(
                f"refusing to reboot {node}: its reason {cur.reason!r} is not babysitter's",
                cur.reason,
            )
        # every backend through scontrol: no REST version has a reboot endpoint
        self.sc.reboot(node, self.full_reason(reason), nextstate)

    def cancel_reboot(self, node: str) -> None:
        # every backend through scontrol, as the reboot itself
        self.sc.cancel_reboot(validate_node(node))

    def cancel_job(self, job_id: int) -> None:
        # every backend through scancel, as the reboot through scontrol
        self.sc.cancel_job(validate_job_id(job_id))

    def reboot_program(self) -> str:
        return self.sc.config_value("RebootProgram")

    def hold_for_validation(self, node: str, reservation: str, user: str, minutes: int) -> None:
        self.sc.create_reservation(reservation, validate_node(node), user, minutes, exist_ok=True)

    def reserve_maintenance(self, name: str, nodes: list[str], user: str, minutes: int) -> None:
        for n in nodes:
            validate_node(n)
        word = re.compile(r"[A-Za-z0-9_.-]{1,64}")
        if not nodes or not word.fullmatch(name) or not word.fullmatch(user):
            raise SlurmRejected(f"invalid maintenance reservation {name!r} for {user!r}")
        self.sc.create_reservation(name, ",".join(nodes), user, minutes)

    def end_maintenance(self, name: str) -> None:
        self.sc.delete_reservation(name)

    def hold_idle(self, name: str, nodes: Sequence[str], user: str, minutes: int) -> None:
        self.sc.hold_idle(_hold_name(name), [validate_node(n) for n in nodes], user, minutes)

    def shrink_hold(self, name: str, nodes: Sequence[str]) -> None:
        self.sc.shrink_hold(_hold_name(name), [validate_node(n) for n in nodes])

    def release_hold(self, name: str) -> None:
        self.sc.delete_reservation(_hold_name(name))

    def holds(self, prefix: str) -> dict[str, tuple[str, ...]]:
        return {k: v for k, v in self.sc.reservations().items() if k.startswith(prefix)}


_HOLD_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _hold_name(name: str) -> str:
    if not _HOLD_RE.match(name):
        raise SlurmRejected(f"invalid reservation name {name!r}")
    return name
