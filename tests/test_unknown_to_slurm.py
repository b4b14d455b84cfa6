"""A node that reports to babysitter but that Slurm does not list (a NodeName typo, a node not
yet in slurm.conf, one removed from it): its fault is paged for what it is, "unknown to Slurm:
not drained", never "held drained by babysitter" when nothing was or could be drained."""

from __future__ import annotations

import uuid
from pathlib import Path

from babysitter.controller.loop.record.alerts import Alert
from tests.fixtures.healing import Cluster, xid79


def test_a_fault_on_a_node_slurm_does_not_know_is_paged_as_such(tmp_path: Path):
    c = Cluster(tmp_path)
    sent: list[Alert] = []
    route = c.engine.router.process
    c.engine.router.process = lambda firing, clearing, now: (  # type: ignore[method-assign]
        sent.extend(firing),
        route(firing, clearing, now),
    )[1]
    c.boot["gpu-x9"] = str(uuid.uuid4())
    c.report("gpu-x9", xid79())  # reports, but Slurm has no such node
    c.tick()
    c.tick()
    (alert,) = {a.condition: a for a in sent if a.node == "gpu-x9"}.values()
    assert alert.condition == "node_unhealthy_not_in_slurm"
    assert "unknown to Slurm: not drained" in alert.summary and "XID 79" in alert.summary
    assert "held drained" not in alert.action_taken
    assert not [op for op, target in c.slurm.calls if "gpu-x9" in target]
    # the fault clears: the alert resolves
    c.report("gpu-x9")
    c.tick()
    assert "gpu-x9|node_unhealthy_not_in_slurm" not in c.engine.router.firing_keys()
    c.close()
