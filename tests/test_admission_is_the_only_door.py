"""No path around admission (issue 49, deliverable 2): a controller module outside the
executor/admission layer that calls a Slurm-changing client method, or issues an agent order,
is a side door. This reads the code (AST) and names each one file:line."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from babysitter.controller.loop.admit.admission import Act, Admission, Refusal, Why
from babysitter.controller.loop.admit.gate import GENERIC, SLURM_CHANGES, AdmittedSlurm, Held
from babysitter.controller.loop.heal.episode.states import TABLE
from babysitter.slurm.base import Scontrol
from babysitter.slurm.cli import CliSlurmClient
from babysitter.slurm.pyslurm import PyslurmSlurmClient
from babysitter.slurm.rest import RestSlurmClient
from bench.slurm_standin import InMemorySlurm

ROOT = Path(__file__).resolve().parent.parent
CONTROLLER = ROOT / "babysitter" / "controller"
# the layer allowed to change Slurm or to order an agent: it asks admission itself
ALLOWED = {
    "babysitter/controller/loop/admit/gate.py",  # the door: node changes admitted first
    "babysitter/controller/loop/act/executor.py",  # admits each action right before it runs
    "babysitter/controller/loop/admit/admission.py",
    "babysitter/controller/loop/admit/order_permission.py",  # the one place orders are issued
}
# what issues an agent order: its expiry stamp, its id, a ledger row moved into the order's
# phase, an RMA collection's row
ORDER_CALLS = {"stamp"}
ORDER_KEYWORDS = {"order_id"}
ORDER_PHASE = "RESETTING"


def _receiver(node: ast.expr) -> str:
    return ast.unparse(node).lower()


def _door(node: ast.expr) -> bool:
    """The receiver is the door: `AdmittedSlurm(...)`, or a module's `admitted` property."""
    if isinstance(node, ast.Call):
        return getattr(node.func, "id", "") == "AdmittedSlurm"
    return isinstance(node, ast.Attribute) and node.attr == "admitted"


def side_doors(source: str, path: str) -> list[str]:
    """Each Slurm change or agent order in `source` that goes around the door: 'path:line what'."""
    hits = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Attribute) and node.attr in SLURM_CHANGES:
            if _door(node.value):
                continue
            if node.attr in GENERIC and not any(
                w in _receiver(node.value) for w in ("slurm", "client")
            ):
                continue  # a lock's release, a thread's run
            hits.append(f"{path}:{node.lineno} Slurm {node.attr} ({SLURM_CHANGES[node.attr][0]})")
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "insert"
            and "rma_archives" in ast.unparse(node.value)  # an RMA collection's row
        ):
            hits.append(f"{path}:{node.lineno} agent order (RMA collection row)")
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if name in ORDER_CALLS:
            hits.append(f"{path}:{node.lineno} agent order ({name})")
        hits += [
            f"{path}:{node.lineno} agent order ({k.arg}=)"
            for k in node.keywords
            if k.arg in ORDER_KEYWORDS
        ]
        if name in ("move", "add") and any(
            isinstance(a, ast.Attribute) and a.attr == ORDER_PHASE for a in node.args
        ):
            hits.append(f"{path}:{node.lineno} agent order (ledger row into {ORDER_PHASE})")
    return hits


def scan() -> list[str]:
    hits = []
    for f in sorted(CONTROLLER.rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        if rel not in ALLOWED:
            hits += side_doors(f.read_text(), rel)
    return hits


def test_no_controller_module_goes_around_admission() -> None:
    hits = scan()
    assert not hits, "side doors around the admission step:\n" + "\n".join(hits)


HEAL = CONTROLLER / "loop" / "heal"


def _healer_modules() -> list[str]:
    """healer.py and every step of its state machine (heal/episode/states.py): the modules
    that take the healer as `h` (heal/episode/base.py's HealerBase)."""
    found = sorted(
        f.relative_to(ROOT).as_posix()
        for f in HEAL.rglob("*.py")
        if f.name == "healer.py" or "heal.episode.base import" in f.read_text()
    )
    # each transition of the table is among them: a new one cannot slip past this test
    for t in TABLE.values():
        src = Path(inspect.getsourcefile(t.handler) or "").relative_to(ROOT).as_posix()
        assert src in found, src
    return found


@pytest.mark.parametrize("rel", _healer_modules())
def test_a_direct_drain_in_the_healer_is_found(rel: str) -> None:
    """A deliberately added `h.slurm.drain(...)` in one of the healer's modules (on a copy of
    the source, the tree is not touched) is a hit naming its file and line; the same call
    through the door is not."""
    text = (ROOT / rel).read_text()
    assert side_doors(text, rel) == []
    lines = text.splitlines()
    for receiver, found in (("slurm", True), ("admitted", False)):
        door = [
            "",
            "",
            "def _side_door(h: Any, node: str) -> None:",
            f"    h.{receiver}.drain(node, 'x')",
        ]
        hits = side_doors("\n".join([*lines, *door]), rel)
        # 1-based: the call is the last line
        assert hits == ([f"{rel}:{len(lines) + 4} Slurm drain (node)"] if found else [])


def test_an_order_issued_outside_order_permission_is_found() -> None:
    """An agent order written beside order_permission.issue (a ledger row moved into the
    order's phase with an id and an expiry) is a hit."""
    src = (
        "def order(ledger, rem, now):\n"
        "    ledger.move(rem, Phase.RESETTING, now, 'reset', order_id='1', **stamp(now, 300))\n"
    )
    assert sorted(side_doors(src, "x.py")) == [
        "x.py:2 agent order (ledger row into RESETTING)",
        "x.py:2 agent order (order_id=)",
        "x.py:2 agent order (stamp)",
    ]


def test_a_lock_release_is_not_a_slurm_change() -> None:
    assert side_doors("def f(self):\n    self._slots.release()\n", "x.py") == []
    assert side_doors("def f(self):\n    self.slurm.release(4)\n", "x.py") == [
        "x.py:2 Slurm release (job)"
    ]


# the clients' methods that only read Slurm (or format text): everything else is in the table
READS = {
    "config_value", "env", "full_reason", "has_reservation", "holds", "job", "job_outcome",
    "jobs", "jobs_on", "node", "nodes", "nodes_named", "owns", "prog", "reboot_program",
    "reservations", "topology", "validation_outcome",
}  # fmt: skip


def test_every_changing_method_of_every_slurm_client_is_classified() -> None:
    """A method added to a client is a read named here or a change the scan looks for."""
    for client in (Scontrol, CliSlurmClient, RestSlurmClient, PyslurmSlurmClient):
        public = {n for n, _ in inspect.getmembers(client, inspect.isfunction) if n[0] != "_"}
        assert public - READS - SLURM_CHANGES.keys() == set(), client.__name__


class _Admission:
    """The admission step's answer for a test: n2 is in a maintenance window."""

    def check(self, act: Act, nodes: Sequence[str], now: datetime, **kw: Any) -> dict:
        return {n: self.one(act, n, now) for n in nodes}

    def one(self, act: Act, node: str, now: datetime) -> Refusal | None:
        if node != "n2":
            return None
        return Refusal(Why.MAINTENANCE, f"{node} is in a maintenance window")


def test_a_held_node_change_never_reaches_slurm() -> None:
    """Through the door, a drain the admission step refuses is not sent: it raises Held with
    the admission's reason; in a batch only the admitted nodes go to Slurm."""
    slurm = InMemorySlurm(["n1", "n2", "n3"])
    door = AdmittedSlurm(slurm, cast(Admission, _Admission()))
    now = datetime.now(UTC)
    with pytest.raises(Held, match="held: n2 is in a maintenance window"):
        door.drain("n2", "x", now)
    got = door.drain_many(["n1", "n2", "n3"], "x", now)
    assert isinstance(got["n2"], Held) and got["n1"] is None and got["n3"] is None
    assert sorted(n.name for n in slurm.nodes() if n.drained_or_draining) == ["n1", "n3"]
    with pytest.raises(Held):
        door.reboot("n2", "reboot: x", "RESUME", ("r", "root", 10), now)
