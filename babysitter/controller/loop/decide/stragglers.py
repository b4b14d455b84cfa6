"""Stragglers: pure policy, facts in and decisions out, no I/O.

One slow node slows a whole synchronous training job (MegaScale, NSDI 2024, reports finding and
fixing such stragglers in its 12,288-GPU jobs). A node is slow when a throughput metric of its
own is more than `threshold` below the fleet median of the nodes with the same GPU model, in
`consecutive` of its own measurements in a row. Metrics: the SDC test's GFLOP/s per device (the
node's slowest device counts: a synchronous job waits for it) and NCCL bus bandwidth when
measured. Nodes are compared only with their own GPU model, and only when enough peers were
measured for a median to mean something.

The caller keeps the returned streaks and passes them back on the next evaluation; a node's
streak moves only when it has a new measurement (its `measured_at` changed), so evaluating
more often than nodes measure does not count the same measurement twice.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from babysitter.controller.loop.decide.node.decisions import Decision, DecisionKind
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.finding import Severity

CONDITION = "node_slow"
RULE = Rule.NODE_SLOW
METRICS = ("gflops", "busbw")


@dataclass(frozen=True)
class StragglerSettings:
    threshold: float = 0.10  # slow: below (1 - threshold) x the fleet median
    consecutive: int = 3
    action: Literal["alert", "drain"] = "alert"
    min_peers: int = 5  # fewer measured nodes of a GPU model: no median, no judgement

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1 or self.consecutive < 1 or self.min_peers < 2:
            raise ValueError(f"invalid straggler settings: {self}")

    @classmethod
    def from_config(cls, cfg: Any) -> StragglerSettings:
        p = cfg.policy
        return cls(
            threshold=p.straggler_threshold,
            consecutive=p.straggler_consecutive,
            action=p.straggler_action,
        )


@dataclass(frozen=True)
class NodePerf:
    """A node's latest throughput measurement, as its agent reported it."""

    node: str
    gpu_model: str
    measured_at: float  # when measured (any monotone stamp); a new value = a new measurement
    gflops: tuple[float, ...] = ()  # per device, SDC matmul
    busbw_gbps: float | None = None  # NCCL all_reduce_perf bus bandwidth


@dataclass(frozen=True)
class Streak:
    measured_at: float | None = None  # the last measurement counted
    slow: int = 0  # slow measurements in a row
    flagged: bool = False  # node_slow is raised


@dataclass
class StragglerResult:
    streaks: dict[str, Streak]
    decisions: list[Decision]
    slow_now: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> evidence


def _value(p: NodePerf, metric: str) -> float | None:
    if metric == "gflops":
        return min(p.gflops) if p.gflops else None
    return p.busbw_gbps


def _fleet_medians(perfs: Sequence[NodePerf], s: StragglerSettings) -> dict[tuple[str, str], float]:
    """(GPU model, metric) -> median over that model's nodes. GFLOP/s: the median of every device
    of the model (a node's devices are peers too); bus bandwidth: of every node."""
    pools: dict[tuple[str, str], list[float]] = {}
    counts: dict[tuple[str, str], int] = {}
    for p in perfs:
        if p.gflops:
            pools.setdefault((p.gpu_model, "gflops"), []).extend(p.gflops)
            counts[(p.gpu_model, "gflops")] = counts.get((p.gpu_model, "gflops"), 0) + 1
        if p.busbw_gbps is not None:
            pools.setdefault((p.gpu_model, "busbw"), []).append(p.busbw_gbps)
            counts[(p.gpu_model, "busbw")] = counts.get((p.gpu_model, "busbw"), 0) + 1
    return {k: statistics.median(v) for k, v in pools.items() if counts[k] >= s.min_peers and v}


def evaluate(
    perfs: Sequence[NodePerf], streaks: Mapping[str, Streak], s: StragglerSettings
) -> StragglerResult:
    """Judge every node's latest measurement against its GPU model's fleet median."""
    medians = _fleet_medians(perfs, s)
    out: dict[str, Streak] = dict(streaks)
    decisions: list[Decision] = []
    slow_now: dict[str, dict[str, Any]] = {}
    for p in sorted(perfs, key=lambda p: p.node):
        old = streaks.get(p.node, Streak())
        evidence: dict[str, Any] = {}
        judged = False
        for metric in METRICS:
            v = _value(p, metric)
            med = medians.get((p.gpu_model, metric))
            if v is None or med is None or med <= 0:
                continue
            judged = True
            if v < (1 - s.threshold) * med:
                evidence[metric] = {"value": v, "fleet_median": med, "ratio": v / med}
        if evidence:
            slow_now[p.node] = evidence
        if not judged or p.measured_at == old.measured_at:
            new = old  # nothing new to count
        elif evidence:
            new = Streak(p.measured_at, old.slow + 1, old.flagged)
        else:
            new = Streak(p.measured_at, 0, False)
        if new.slow >= s.consecutive:
            new = Streak(new.measured_at, new.slow, True)
        out[p.node] = new
        if new.flagged and new.slow >= s.consecutive:
            decisions.append(_slow_decision(p, new, evidence, s))
        elif old.flagged and not new.flagged:
            decisions.append(
                Decision(DecisionKind.RESOLVE_ALERT, p.node, RULE, "", condition=CONDITION)
            )
    return StragglerResult(out, decisions, slow_now)


def _slow_decision(
    p: NodePerf, st: Streak, evidence: dict[str, Any], s: StragglerSettings
) -> Decision:
    parts = [
        f"{'GFLOP/s (slowest device)' if m == 'gflops' else 'NCCL bus bandwidth'} "
        f"{e['value']:.4g} = {e['ratio']:.0%} of the {p.gpu_model} median {e['fleet_median']:.4g}"
        for m, e in evidence.items()
    ]
    reason = (
        f"{p.node} slow in {st.slow} measurements in a row: "
        + ("; ".join(parts) or "below the fleet median")
        + f" (threshold {s.threshold:.0%} below)"
    )
    return Decision(
        DecisionKind.DRAIN if s.action == "drain" else DecisionKind.ALERT,
        p.node,
        RULE,
        reason,
        Severity.WARNING,
        CONDITION,
        details={"gpu_model": p.gpu_model, "consecutive": st.slow, **evidence},
    )


def perf_from_metrics(node: str, metrics: Any) -> NodePerf | None:
    """A node's latest throughput from its report metrics (`perf_gflops` from the SDC check,
    `perf_busbw` from the NCCL check). A node speaks only for itself, and a malformed value
    is no measurement rather than an error."""
    if not isinstance(metrics, dict):
        return None
    g = metrics.get("perf_gflops")
    b = metrics.get("perf_busbw")
    gflops: tuple[float, ...] = ()
    model, stamps = "", []
    try:
        if isinstance(g, dict):
            gflops = tuple(float(x) for x in list(g.get("gflops") or [])[:64])
            model = str(g.get("gpu_model") or "")[:128]
            stamps.append(float(g.get("measured_at") or 0))
        busbw = float(b["busbw_gbps"]) if isinstance(b, dict) else None
        if isinstance(b, dict):
            stamps.append(float(b.get("measured_at") or 0))
    except (TypeError, ValueError, KeyError):
        return None
    if not gflops and busbw is None:
        return None
    return NodePerf(node, model or "unknown", max(stamps, default=0.0), gflops, busbw)
