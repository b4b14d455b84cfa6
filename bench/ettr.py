"""Effective training time (ETTR) of one large training job over weeks, by discrete-event
simulation: what a health tool's detection and requeue latencies are worth to a training team.

Failures arrive per root cause at the rates of a published run (bench/data/ettr_inputs.toml,
every number sourced there); each shows as a check class (XID, ECC, IB, SDC, hang, undetectable,
...) that a tool sees or not. The arms share the same failures (common random numbers, so they
differ only in their parameters):

- babysitter at default settings, its fault -> drain and fault -> requeue latencies read from
  bench/results/fault_drain.json (a documented fallback when a figure is missing);
- NHC as Slurm's HealthCheckProgram every 300 s and every 60 s (bench/nhc.py's checks plus
  check_hw_ib, the IB port check a site would add): latency uniform over the interval plus one
  run plus one scontrol drain; it sees only what its checks see and never touches the job;
- no health tool: a human notices (human-paced);
- perfect detection: everything seen and requeued at once, the bound no tool can beat.

Every arm is charged alike for what it does wrong under benign noise: the point estimate of its
false interruptions (a healthy job requeued: a restart, like any fault) and false drains (its node
out of the pool while the job runs on) per node-day from the same soak (bench/results/soak.json),
with the ETTR also shown over those rates' two-sided 95 % intervals. A rate nobody measured is
printed "not measured" and assumed 0 (NHC's false drains, until NHC runs in the soak). Falsely
drained nodes and nodes out for repair share the spare pool: a restart waits for nodes when more
are out than there are spares. The soak's one-sided upper bounds are what-if rows only.

Then the same at one checkpoint interval under other values of the assumptions that move the
answer most (VARIANTS).

ETTR = training time kept / wall time. Lost time = checkpoint writes + work since the last
complete checkpoint + time from the fault until the job computes again (detect, take the bad
node out, requeue, restart and load the checkpoint).

Run: python -m bench.ettr [--replicas N] [--seed S]
(writes bench/results/ettr.json, ettr.md and ettr.png)"""

from __future__ import annotations

import argparse
import copy
import heapq
import json
import math
import sys
import time
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from babysitter.checks.xid.check import xid_finding
from babysitter.controller.loop.decide.node.verdict import drain_worthy
from bench.common import BENCH_DIR, RESULTS_DIR, figure, write_result
from bench.poisson import poisson_interval

INPUTS = BENCH_DIR / "data" / "ettr_inputs.toml"
DAY = 86400.0
INF = math.inf
MANIFESTS = ("crash", "hang", "silent")
# lost-time categories besides the root causes
CKPT, PLANNED, WRONG_DRAIN = "checkpoint writes", "planned maintenance", "false interruptions"
IDEAL = "perfect detection (bound)"
SELF_HEAL = "babysitter + self-healing"


@dataclass(frozen=True)
class Latency:
    """One draw: an empirical sample picked at random + a uniform wait over a poll interval + a
    constant (a tool's own run time)."""

    samples: tuple[float, ...] = (0.0,)
    poll_s: float = 0.0
    const_s: float = 0.0

    def draw(self, u_pick: float, u_poll: float) -> float:
        return self.samples[int(u_pick * len(self.samples))] + u_poll * self.poll_s + self.const_s


@dataclass(frozen=True)
class Arm:
    name: str
    sees: dict[str, float]  # check class -> share of its faults this arm's checks see
    latency: dict[str, Latency]  # check class -> fault -> node drained
    acts_on_job: bool  # requeues the job when it drains its node (else the job runs on / hangs)
    requeue: Latency = Latency()  # drain -> job pending again, when acts_on_job
    # a healthy job requeued (per node-day): a restart from the last checkpoint, like a fault
    false_interruptions_per_node_day: float = 0.0
    # a healthy node drained while its job runs on (per node-day): its node is out of the pool
    # (a spare takes its place at the job's next restart) for false_drain_s
    false_drains_per_node_day: float = 0.0
    false_drain_s: float = 0.0  # how long a false drain keeps its node out
    # the two-sided 95 % intervals of those rates (None: no interval, e.g. not measured)
    false_interruptions_ci95: tuple[float, float] | None = None
    false_drains_ci95: tuple[float, float] | None = None
    # babysitter's self-healing loop (detect -> drain -> reboot -> validate -> resume) less the
    # reboot itself; None: a human reboots the node (after human_response_s)
    self_heal: Latency | None = None


@dataclass(frozen=True)
class ClassDef:
    manifests: str  # crash | hang | silent
    exclude: bool  # the bad node must leave the job before a restart works
    slurm_s: float | None  # Slurm (or an operator) takes the node out itself after this long


@dataclass(frozen=True)
class Model:
    gpus: int
    days: float
    gpus_per_node: int
    causes: tuple[str, ...]
    cause_rate: tuple[float, ...]  # per GPU-second
    cause_classes: tuple[tuple[tuple[str, float], ...], ...]
    classes: dict[str, ClassDef]
    planned_rate: float  # per GPU-second
    write_s: float
    restart_s: float
    nccl_watchdog_s: float
    wrapper_requeue_s: float
    human_response_s: tuple[float, float]
    human_sdc_s: tuple[float, float]
    spare_nodes: int = 1_000_000  # restarts never wait for a repaired node
    reboot_s: tuple[float, float] = (0.0, 0.0)
    hardware_repair_s: tuple[float, float] = (0.0, 0.0)
    heal_share: dict[str, float] = field(default_factory=dict)  # class -> fixed by a reboot
    notes: tuple[str, ...] = field(default=())

    @property
    def horizon_s(self) -> float:
        return self.days * DAY

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)


def load_inputs(path: Path = INPUTS) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


def xid_drained(xid: int, overrides: dict[int, Any] | None = None) -> bool:
    """Does babysitter drain a node for this XID? Asked of the product itself: the finding its
    XID event source makes (catalog babysitter/hardware/xids.py, site overrides) and the
    policy's own drain test. NVLink XID 74 (NVIDIA's catalog: reset the GPU) and XID 154 (the
    driver's recovery action) are drained; an application's XID (13) is not."""
    f = xid_finding("xid.nvml", xid, overrides or {}, "gpu0", "GPU 0")
    return drain_worthy(f)


def resolve_xids(inp: dict[str, Any]) -> dict[str, Any]:
    """Split the XID class by what the product does with each XID: `xid_drained` (babysitter
    drains the node) and `xid_alerted` (an alert for a human, or nothing). Each cause's XID
    share is split by its XID mix (`xids`, else [class.xid] mix); NHC sees the XIDs of
    `nhc_sees_xids` (the GPU disappears or shows the error in nvidia-smi), or every XID when
    `nhc_reads_xids` (a site XID check). Inputs without an `xid` class pass unchanged."""
    if "xid" not in inp["class"]:
        return inp
    out = copy.deepcopy(inp)
    xc = out["class"].pop("xid")
    bs = out["babysitter"]
    overrides = {int(k): v for k, v in bs.get("xid_overrides", {}).items()}
    drain_all = bool(bs.get("xid_drain_all", False))
    nhc_all = bool(xc.get("nhc_reads_xids", False))
    nhc_xids = {int(x) for x in xc.get("nhc_sees_xids", [])}
    weight = {"xid_drained": 0.0, "xid_alerted": 0.0}
    nhc_weight = {"xid_drained": 0.0, "xid_alerted": 0.0}
    for c in out["cause"]:
        share = float(c["classes"].pop("xid", 0.0))
        if share <= 0:
            continue
        mix = {int(k): float(v) for k, v in c.get("xids", xc["mix"]).items()}
        total = sum(mix.values())
        for x, v in mix.items():
            k = "xid_drained" if drain_all or xid_drained(x, overrides) else "xid_alerted"
            part = share * v / total
            c["classes"][k] = c["classes"].get(k, 0.0) + part
            w = part * float(c["count"])
            weight[k] += w
            nhc_weight[k] += w if (nhc_all or x in nhc_xids) else 0.0
    base = {k: v for k, v in xc.items() if k in ("manifests", "exclude", "slurm_s")}
    for k, bs_sees in (("xid_drained", 1.0), ("xid_alerted", 0.0)):
        nhc = nhc_weight[k] / weight[k] if weight[k] else 0.0
        out["class"][k] = {**base, "babysitter_sees": bs_sees, "nhc_sees": nhc}
    return out


def xid_coverage(inp: dict[str, Any]) -> list[str]:
    """Per cause with XIDs: which XIDs babysitter drains and which it only alerts on."""
    if "xid" not in inp["class"]:
        return []
    xc = inp["class"]["xid"]
    overrides = {int(k): v for k, v in inp["babysitter"].get("xid_overrides", {}).items()}
    lines = []
    for c in inp["cause"]:
        share = float(c["classes"].get("xid", 0.0))
        if share <= 0:
            continue
        mix = {int(k): float(v) for k, v in c.get("xids", xc["mix"]).items()}
        total = sum(mix.values())
        drained = sum(v for x, v in mix.items() if xid_drained(x, overrides)) / total
        parts = ", ".join(
            f"{x} {v / total:.0%} ({'drained' if xid_drained(x, overrides) else 'alert only'})"
            for x, v in mix.items()
        )
        lines.append(
            f"{c['name']}: {share:.0%} of its faults show as XIDs [{parts}] -> babysitter "
            f"drains {share * drained:.0%} of this cause's faults"
        )
    return lines


def build_model(
    inp: dict[str, Any], *, gpus: int | None = None, days: float | None = None
) -> Model:
    """Rates per GPU-second from the reference run; the job's rate scales with its GPU count (Meta's
    RSC study: mean time to failure falls inversely with job size)."""
    inp = resolve_xids(inp)
    ref = inp["reference"]
    gpu_s = ref["gpus"] * ref["days"] * DAY
    classes = {
        name: ClassDef(c["manifests"], bool(c["exclude"]), c.get("slurm_s"))
        for name, c in inp["class"].items()
    }
    for name, c in classes.items():
        if c.manifests not in MANIFESTS:
            raise ValueError(f"class {name}: manifests {c.manifests!r} not in {MANIFESTS}")
    causes, rates, shares = [], [], []
    for c in inp["cause"]:
        cl = {k: float(v) for k, v in c["classes"].items() if v > 0}
        if abs(sum(cl.values()) - 1.0) > 1e-9 or not set(cl) <= set(classes):
            raise ValueError(f"cause {c['name']}: class shares must sum to 1 over known classes")
        causes.append(c["name"])
        rates.append(c["count"] / gpu_s)
        shares.append(tuple(cl.items()))
    if sum(c["count"] for c in inp["cause"]) != ref["unexpected"]:
        raise ValueError("cause counts do not add up to reference.unexpected")
    t = inp["timing"]
    rep = inp.get("repair", {})
    return Model(
        gpus=gpus or inp["job"]["gpus"],
        days=days or inp["job"]["days"],
        gpus_per_node=inp["job"]["gpus_per_node"],
        causes=tuple(causes),
        cause_rate=tuple(rates),
        cause_classes=tuple(shares),
        classes=classes,
        planned_rate=ref["planned"] / gpu_s,
        write_s=float(inp["checkpoint"]["write_s"]),
        restart_s=float(inp["checkpoint"]["restart_s"]),
        nccl_watchdog_s=float(t["nccl_watchdog_s"]),
        wrapper_requeue_s=float(t["wrapper_requeue_s"]),
        human_response_s=(float(t["human_response_s"][0]), float(t["human_response_s"][1])),
        human_sdc_s=(float(t["human_sdc_s"][0]), float(t["human_sdc_s"][1])),
        spare_nodes=int(rep.get("spare_nodes", 1_000_000)),
        reboot_s=_pair(rep.get("reboot_s", [0, 0])),
        hardware_repair_s=_pair(rep.get("hardware_repair_s", [0, 0])),
        heal_share={k: float(v) for k, v in rep.get("heal_share", {}).items()},
    )


def _pair(v: list[float]) -> tuple[float, float]:
    return float(v[0]), float(v[1])


# ---- measured figures -> arms


def _fault_drain_samples(results_dir: Path) -> tuple[dict[str, list[float]], bool]:
    """fault_drain's samples, and whether they were taken at default settings. Those include
    the wait for the polled check's next read (faults are injected at a random phase), so no
    poll interval is added on top; older files hold samples taken with every check at 0.5 s."""
    try:
        doc = json.loads((results_dir / "fault_drain.json").read_text())
        details = doc.get("details", {})
        at_defaults = "samples_defaults" in details
        samples = details.get("samples_defaults" if at_defaults else "samples", {})
        return {k: [float(x) for x in v] for k, v in samples.items() if v}, at_defaults
    except (OSError, ValueError, AttributeError):
        return {}, False


def _self_heal_samples(results_dir: Path) -> tuple[list[float], str]:
    """The self-healing loop's time without its reboot (bench/self_heal.py: detect, drain,
    wait for jobs, validation, resume), per injection; at default settings where measured."""
    for name in ("self_heal_defaults", "self_heal"):
        try:
            doc = json.loads((results_dir / f"{name}.json").read_text())
            got = [float(x["total"]) - float(x["reboot"]) for x in doc["details"]["samples"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if got:
            intervals = doc.get("settings", {}).get("intervals", "sim settings")
            return got, f"{name}.json of {doc.get('date', '?')}, {intervals}"
    return [], ""


SOAK_BOUND = "false drains per node-day, 95 % upper bound (soak)"
SOAK_INTERRUPTIONS = "false job interruptions per node-day, 95 % upper bound (soak)"


@dataclass(frozen=True)
class SoakRates:
    """What the soak measured (bench/results/soak.json), per node-day: the point estimates
    (count / node-days) of false interruptions (None: an older soak that did not count them)
    and false drains with their two-sided 95 % intervals (Garwood), the one-sided 95 % upper
    bounds (what-if rows only), and how long a false drain kept its node out (None: no drain
    to measure it on)."""

    interruptions: float | None
    drains: float
    drain_s: float | None
    how: str
    interruptions_ci95: tuple[float, float] | None = None
    drains_ci95: tuple[float, float] = (0.0, 0.0)
    interruptions_upper: float | None = None
    drains_upper: float = 0.0
    # NHC's arms in the same soak (bench/nhc_model.py), by interval ("60", "300"): point false
    # drains per node-day, their 95 % interval, and the mean drain in seconds
    nhc: dict[str, tuple[float, tuple[float, float], float]] = field(default_factory=dict)


def _measured_soak(results_dir: Path) -> SoakRates | None:
    """The soak's counts and exposure, as point estimates with Garwood intervals computed here
    from the counts (so an older soak.json, which stored only the one-sided bounds, reads the
    same way)."""
    try:
        doc = json.loads((results_dir / "soak.json").read_text())
        d = doc["details"]
        figs = {f.get("metric"): f for f in doc["figures"]}
        node_days = float(d["node_days"])
        k = int(d["false_drains"])
        drains_upper = float(figs[SOAK_BOUND]["value"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if node_days <= 0:
        return None
    got = figs.get(SOAK_INTERRUPTIONS)
    m = d.get("false_interruptions") if got else None
    mean_h = d.get("drain_hours_mean")
    drain_s = float(mean_h) * 3600 if mean_h else None
    how = (
        f"{d.get('false_interruptions', '?')} false interruptions and {k} false "
        f"drains in {node_days:.1f} node-days ({d['node_hours']:,.0f} node-hours, "
        f"soak.json of {doc.get('date', '?')})"
    )
    return SoakRates(
        interruptions=None if m is None else int(m) / node_days,
        drains=k / node_days,
        drain_s=drain_s,
        how=how,
        interruptions_ci95=None if m is None else poisson_interval(int(m), node_days),
        drains_ci95=poisson_interval(k, node_days),
        interruptions_upper=float(got["value"]) if got else None,
        drains_upper=drains_upper,
        nhc={
            iv: (
                int(x["false_drains"]) / node_days,
                poisson_interval(int(x["false_drains"]), node_days),
                float(x.get("drain_hours_mean", 0.0)) * 3600,
            )
            for iv, x in d.get("nhc", {}).items()
        },
    )


def _fmt_ci(ci: tuple[float, float] | None) -> str:
    return "no interval" if ci is None else f"95 % CI [{ci[0]:.3g}, {ci[1]:.3g}]"


def build_arms(inp: dict[str, Any], results_dir: Path = RESULTS_DIR) -> tuple[list[Arm], list[str]]:
    """The arms, and notes saying where each babysitter figure came from (measured or fallback)."""
    notes: list[str] = []
    bs = inp["babysitter"]
    samples, at_defaults = _fault_drain_samples(results_dir)

    def measured(key: str, fallback: float, what: str) -> tuple[float, ...]:
        if key in samples:
            v = samples[key]
            notes.append(f"{what}: measured, {len(v)} samples (fault_drain.json '{key}')")
            return tuple(v)
        notes.append(
            f"{what}: NOT MEASURED (no '{key}' in fault_drain.json), fallback {fallback} s"
        )
        return (fallback,)

    fb = float(bs["fallback_drain_s"])
    xid = measured("xid79", fb, "babysitter XID event -> drain")
    ecc_poll_s = 0.0 if at_defaults else float(bs["ecc_poll_s"])
    ib_poll_s = 0.0 if at_defaults else float(bs["ib_poll_s"])
    how = "at default settings, the poll's wait included" if at_defaults else "+ U(0, poll) s"
    dbe = measured("dbe", fb, f"babysitter ECC -> drain ({how})")
    ib = measured("ib_port_down_for_good", fb, f"babysitter IB port down -> drain ({how})")
    req = measured("job_requeue", float(bs["fallback_requeue_s"]), "babysitter fault -> requeue")
    scontrol = measured("raw_scontrol_drain", 0.01, "scontrol drain (NHC's drain)")
    soak = _measured_soak(results_dir)
    drain_h = float(bs["fallback_false_drain_h"])
    upper = bs.get("charge") == "upper"  # the what-if: charged the one-sided upper bounds
    fi_ci: tuple[float, float] | None = None
    fd_ci: tuple[float, float] | None = None
    if soak is None:
        fi = float(bs["fallback_false_interruptions_per_node_day"])
        fd = float(bs["fallback_false_drains_per_node_day"])
        notes.append(
            f"babysitter false interruptions and false drains: NOT MEASURED (no "
            f"bench/results/soak.json), assumed {fi:g} and {fd:g} per node-day"
        )
    else:
        fd, fd_ci = soak.drains, soak.drains_ci95
        if upper:
            fd, fd_ci = soak.drains_upper, None
        if soak.interruptions is None:
            # an older soak that did not tell them apart: each drain may have been one
            fi, fi_ci = fd, fd_ci
            notes.append(
                f"babysitter false interruptions: {fi:.3g} per node-day, the soak's false "
                f"drains, each charged as an interruption (an older soak that did not tell "
                f"them apart: {soak.how})"
            )
        else:
            fi, fi_ci = soak.interruptions, soak.interruptions_ci95
            what = "point estimate"
            if upper:
                fi, fi_ci, what = soak.interruptions_upper or 0.0, None, "one-sided 95 % bound"
            notes.append(
                f"babysitter false interruptions (a healthy job requeued, charged as a job "
                f"restart): {fi:.3g} per node-day, the soak's {what}, {_fmt_ci(fi_ci)} "
                f"({soak.how})"
            )
        notes.append(
            f"babysitter false drains (its node out of the pool, the job runs on): {fd:.3g} "
            f"per node-day, the soak's {'one-sided 95 % bound' if upper else 'point estimate'}"
            f", {_fmt_ci(fd_ci)}"
        )
        if soak.drain_s is not None:
            drain_h = soak.drain_s / 3600
    if "false_interruptions_per_node_day" in bs:  # a what-if sets it
        fi, fi_ci = float(bs["false_interruptions_per_node_day"]), None
        notes.append(f"babysitter false interruptions: set to {fi:g} per node-day (what-if)")
    notes.append(
        f"babysitter false drain: its node out {drain_h * 60:.1f} min each "
        + ("(soak mean)" if soak is not None and soak.drain_s is not None else "(assumption)")
    )
    nhc_in = inp["nhc"]
    nhc_fd = nhc_in.get("false_drains_per_node_day")
    notes.append(
        "NHC false interruptions: 0 by design (NHC drains a node and never touches its job)"
    )
    nhc_soak = soak.nhc if soak is not None else {}
    if nhc_fd is None and not nhc_soak:
        notes.append(
            "NHC false drains: NOT MEASURED (no NHC arm in soak.json); the headline "
            "assumes 0 for the NHC arms, which favours NHC"
        )
    elif nhc_fd is None:
        for iv, (rate, ci, secs) in sorted(nhc_soak.items(), key=lambda kv: -float(kv[0])):
            notes.append(
                f"NHC every {iv} s false drains: {rate:.3g} per node-day, the soak's point "
                f"estimate, {_fmt_ci(ci)}, {secs / 60:.1f} min each on average (its model of "
                "NHC on the same nodes and noise, bench/nhc_model.py)"
            )
    else:
        notes.append(f"NHC false drains: set to {float(nhc_fd):g} per node-day (what-if)")
    notes.append(
        "NHC's checks: bench/nhc.py's nhc.conf (check_fs_mount_rw, check_hw_physmem_free, "
        "check_nvsmi_healthmon) plus check_hw_ib, the InfiniBand port check a site would add; "
        "bench/nhc.py's own configuration lacks check_hw_ib, so the IB credit of the NHC arms "
        "is modelled, not measured"
    )
    heal, heal_how = _self_heal_samples(results_dir)
    if heal:
        notes.append(
            f"babysitter self-healing loop without its reboot: measured, {len(heal)} samples, "
            f"p50 {float(np.median(heal)):.1f} s ({heal_how}); the reboot is reboot_s"
        )
    else:
        heal = [float(inp.get("repair", {}).get("fallback_self_heal_s", 180))]
        notes.append(
            f"babysitter self-healing loop: NOT MEASURED (no bench/results/self_heal*.json), "
            f"fallback {heal[0]:g} s"
        )
    inp = resolve_xids(inp)
    cls = inp["class"]
    bs_arm = Arm(
        name="babysitter",
        sees={k: float(c["babysitter_sees"]) for k, c in cls.items()},
        latency={
            "xid_drained": Latency(xid),
            "ecc": Latency(dbe, poll_s=ecc_poll_s),
            "ib": Latency(ib, poll_s=ib_poll_s),
        },
        acts_on_job=True,
        requeue=Latency(req),
        false_interruptions_per_node_day=fi,
        false_drains_per_node_day=fd,
        false_drain_s=drain_h * 3600,
        false_interruptions_ci95=fi_ci,
        false_drains_ci95=fd_ci,
    )
    # the same tool with its self-healing on: reboot-class nodes come back by themselves
    arms = [bs_arm, replace(bs_arm, name=SELF_HEAL, self_heal=Latency(tuple(heal)))]
    nhc = inp["nhc"]
    for interval in nhc["intervals_s"]:
        lat = Latency(scontrol, poll_s=float(interval), const_s=float(nhc["run_s"]))
        arms.append(
            Arm(
                name=f"NHC every {interval:g} s",
                sees={k: float(c["nhc_sees"]) for k, c in cls.items()},
                latency={k: lat for k in cls},
                acts_on_job=False,
                **_nhc_false_drains(nhc_fd, nhc_soak.get(f"{interval:g}"), drain_h),
            )
        )
    arms.append(Arm(name="no health tool", sees={}, latency={}, acts_on_job=False))
    # the bound no tool can beat: every class seen at once, the job requeued at once
    zero = Latency()
    arms.append(
        Arm(
            name=IDEAL,
            sees={k: 1.0 for k in cls},
            latency={k: zero for k in cls},
            acts_on_job=True,
            self_heal=zero,  # and rebooted at once where a reboot fixes it
        )
    )
    notes.append(
        f"NHC run time {nhc['run_s']} s: an assumption (bench/nhc.py measures one run's CPU time, "
        "not its wall time with nvidia-smi)"
    )
    return arms, notes


def _nhc_false_drains(
    what_if: float | None, measured: tuple[float, tuple[float, float], float] | None, drain_h: float
) -> dict[str, Any]:
    """An NHC arm's false drains: a what-if's rate, else the soak's NHC arm at this interval,
    else 0 (not measured; printed so) with babysitter's drain length."""
    if what_if is not None:
        return {"false_drains_per_node_day": float(what_if), "false_drain_s": drain_h * 3600}
    if measured is None:
        return {"false_drains_per_node_day": 0.0, "false_drain_s": drain_h * 3600}
    rate, ci, secs = measured
    return {"false_drains_per_node_day": rate, "false_drains_ci95": ci, "false_drain_s": secs}


# ---- simulation


@dataclass
class Draws:
    """One replica's failures, shared by every arm (common random numbers)."""

    times: np.ndarray
    cause: np.ndarray
    klass: list[str]
    u: np.ndarray  # (n, 7): see, pick, poll, requeue pick, human, healed by a reboot?, repair
    planned: np.ndarray
    seed: tuple[int, int]


def draw_replica(model: Model, seed: int, replica: int) -> Draws:
    rng = np.random.default_rng([seed, replica])
    horizon = model.horizon_s
    rates = np.array(model.cause_rate) * model.gpus
    n = int(rng.poisson(rates.sum() * horizon))
    times = np.sort(rng.uniform(0.0, horizon, n))
    cause = rng.choice(len(rates), size=n, p=rates / rates.sum())
    pick = rng.random(n)
    klass = []
    for c, p in zip(cause, pick, strict=True):
        acc = 0.0
        name = model.cause_classes[c][-1][0]
        for k, share in model.cause_classes[c]:
            acc += share
            if p < acc:
                name = k
                break
        klass.append(name)
    u = rng.random((n, 7))
    planned = np.sort(
        rng.uniform(0.0, horizon, int(rng.poisson(model.planned_rate * model.gpus * horizon)))
    )
    return Draws(times, cause, klass, u, planned, (seed, replica))


def _restart_delay(model: Model, arm: Arm, klass: str, u: np.ndarray) -> float:
    """Seconds from a fault until the job computes again."""
    cd = model.classes[klass]
    seen = u[0] < arm.sees.get(klass, 0.0)
    detect = arm.latency[klass].draw(u[1], u[2]) if seen else INF
    lo, hi = model.human_sdc_s if cd.manifests == "silent" else model.human_response_s
    human = lo + u[4] * (hi - lo)
    slurm = INF if cd.slurm_s is None else float(cd.slurm_s)
    self_exit = {"crash": 0.0, "hang": model.nccl_watchdog_s, "silent": INF}[cd.manifests]
    # the bad node out: the first of the tool, Slurm/an operator, a human; a restart before that
    # lands on the bad node and fails again
    out = min(detect, slurm, human) if cd.exclude else 0.0
    # the job stops computing (usefully): on its own, killed with its node, or requeued by a tool
    stop = min(self_exit, slurm, human, detect if arm.acts_on_job else INF)
    # requeued by the tool that drained the node, else by the team's restart wrapper
    requeue = arm.requeue.draw(u[3], 0.0) if arm.acts_on_job and seen else model.wrapper_requeue_s
    return max(stop, out) + requeue + model.restart_s


def _out_of_service(model: Model, arm: Arm, klass: str, u: np.ndarray) -> float:
    """Seconds from a fault until its node is back in the pool: rebooted (by babysitter's loop
    or by a human) where a reboot fixes the fault, else repaired by hand."""
    if u[5] < model.heal_share.get(klass, 0.0):
        reboot = model.reboot_s[0] + u[6] * (model.reboot_s[1] - model.reboot_s[0])
        if arm.self_heal is not None:
            return arm.self_heal.draw(u[6], 0.0) + reboot
        lo, hi = model.human_response_s
        return lo + u[4] * (hi - lo) + reboot
    lo, hi = model.hardware_repair_s
    return lo + u[6] * (hi - lo)


def _spares_wait(model: Model, out_until: list[float], t: float, delay: float) -> float:
    """More nodes out (for repair, or drained) than spares at the restart: the job waits for
    the ones it lacks."""
    still = sorted(r for r in out_until if r > t + delay)
    if len(still) > model.spare_nodes:
        return still[len(still) - model.spare_nodes - 1] - t
    return delay


@dataclass
class RunResult:
    ettr: float
    unexpected: int
    planned: int
    wrong_drains: int  # false interruptions: a healthy job requeued
    lost_s: dict[str, float]
    node_out_s: float = 0.0  # node-seconds out of the pool for repair (capacity, not the job)
    false_drains: int = 0
    false_drain_node_s: float = 0.0  # node-seconds out for false drains (capacity only)


def simulate(model: Model, arm: Arm, draws: Draws, interval_s: float) -> RunResult:
    horizon = model.horizon_s
    events: list[tuple[float, int, int]] = [(float(t), 0, i) for i, t in enumerate(draws.times)]
    events += [(float(t), 1, -1) for t in draws.planned]
    if arm.false_interruptions_per_node_day > 0:
        # own stream, so arms with equal rates draw equal false interruptions
        rng = np.random.default_rng([draws.seed[0], draws.seed[1], 1])
        n = int(rng.poisson(arm.false_interruptions_per_node_day * model.nodes * model.days))
        events += [(float(t), 2, -1) for t in rng.uniform(0.0, horizon, n)]
        fd_u = rng.random((n, 2))
    # a false drain takes its node out of the pool for false_drain_s and leaves the job running
    # on it: the job loses no time unless it restarts while more nodes are out (for repair or
    # drained) than there are spares; then it waits for the ones it lacks (its own stream, so
    # it changes no other draw)
    n_fd = 0
    if arm.false_drains_per_node_day > 0:
        rng_fd = np.random.default_rng([draws.seed[0], draws.seed[1], 2])
        n_fd = int(rng_fd.poisson(arm.false_drains_per_node_day * model.nodes * model.days))
        events += [(float(t), 3, -1) for t in rng_fd.uniform(0.0, horizon, n_fd)]
    events.sort()
    period = interval_s + model.write_s
    lost: dict[str, float] = defaultdict(float)
    productive = 0.0
    run_start = 0.0  # the job computes (or believes it does) from here
    last = CKPT
    counts = [0, 0, 0, 0]
    fd_i = 0
    out_until: list[float] = []  # when the nodes out for repair come back (a heap)
    node_out = 0.0
    for t, kind, i in events:
        counts[kind] += 1
        while out_until and out_until[0] <= t:
            heapq.heappop(out_until)
        if kind == 3:  # a false drain: its node out of the pool, the job runs on
            heapq.heappush(out_until, t + arm.false_drain_s)
            continue
        if kind == 0:
            key = model.causes[draws.cause[i]]
            delay = _restart_delay(model, arm, draws.klass[i], draws.u[i])
            if model.classes[draws.klass[i]].exclude:
                repair = _out_of_service(model, arm, draws.klass[i], draws.u[i])
                node_out += min(repair, horizon - t)
                heapq.heappush(out_until, t + repair)
            # every restart needs the job's full node count: more nodes out (for repair, or
            # falsely drained) than spares and it waits for the ones it lacks
            delay = _spares_wait(model, out_until, t, delay)
        elif kind == 1:
            key = PLANNED
            delay = model.write_s + model.restart_s  # stops after a final checkpoint
            delay = _spares_wait(model, out_until, t, delay)
        else:
            key = WRONG_DRAIN
            delay = arm.requeue.draw(fd_u[fd_i][0], 0.0) + model.restart_s
            fd_i += 1
            # the interrupted job's node was drained too: out of the pool like any false drain
            heapq.heappush(out_until, t + arm.false_drain_s)
            delay = _spares_wait(model, out_until, t, delay)
        restart = t + delay
        if t < run_start:
            # hits the restart (or a job computing garbage before detection): start over
            if restart > run_start:
                lost[key] += restart - run_start
                run_start, last = restart, key
            continue
        span = t - run_start
        k = math.floor(span / period)
        productive += k * interval_s
        lost[CKPT] += k * model.write_s
        rework = span - k * period
        if kind == 1:
            productive += rework
            lost[CKPT] += model.write_s
            lost[key] += delay - model.write_s
        else:
            lost[key] += rework + delay
        run_start, last = restart, key
    if run_start < horizon:
        span = horizon - run_start
        k = math.floor(span / period)
        # the work since the last checkpoint at the end is kept: the job goes on
        productive += span - k * model.write_s
        lost[CKPT] += k * model.write_s
    else:
        lost[last] -= run_start - horizon
    return RunResult(
        productive / horizon,
        counts[0],
        counts[1],
        counts[2],
        dict(lost),
        node_out,
        n_fd,
        n_fd * arm.false_drain_s,
    )


def ci95(values: np.ndarray) -> tuple[float, float]:
    """Mean and half-width of its 95 % confidence interval (normal approximation)."""
    m = float(np.mean(values))
    if len(values) < 2:
        return m, INF
    return m, float(1.96 * np.std(values, ddof=1) / math.sqrt(len(values)))


def run_arms(
    model: Model,
    arms: list[Arm],
    intervals_s: list[float],
    replicas: int,
    seed: int,
) -> dict[str, Any]:
    """ETTR per arm and interval over replicas, with the lost-time breakdown."""
    draws = [draw_replica(model, seed, r) for r in range(replicas)]
    out: dict[str, Any] = {"arms": {}, "intervals_min": [i / 60 for i in intervals_s]}
    for arm in arms:
        per_iv = []
        for iv in intervals_s:
            res = [simulate(model, arm, d, iv) for d in draws]
            e = np.array([r.ettr for r in res])
            mean, half = ci95(e)
            lost: dict[str, float] = defaultdict(float)
            for r in res:
                for k, v in r.lost_s.items():
                    lost[k] += v / 3600 / replicas
            per_iv.append(
                {
                    "interval_min": iv / 60,
                    "ettr": mean,
                    "ci95": half,
                    "ettr_samples": e.tolist(),
                    "unexpected_mean": float(np.mean([r.unexpected for r in res])),
                    "planned_mean": float(np.mean([r.planned for r in res])),
                    "wrong_drains_mean": float(np.mean([r.wrong_drains for r in res])),
                    "false_drains_mean": float(np.mean([r.false_drains for r in res])),
                    "false_drain_node_hours": float(
                        np.mean([r.false_drain_node_s for r in res]) / 3600
                    ),
                    "node_hours_out": float(np.mean([r.node_out_s for r in res])) / 3600,
                    "lost_hours": dict(sorted(lost.items(), key=lambda kv: -kv[1])),
                }
            )
        out["arms"][arm.name] = per_iv
    return out


def rate_intervals(
    model: Model, arms: list[Arm], interval_s: float, replicas: int, seed: int
) -> dict[str, tuple[float, float]]:
    """Each arm's ETTR with its false rates at the two ends of their 95 % intervals, on the
    same failures: (ETTR at the upper ends, ETTR at the lower ends). An arm without an
    interval gets its point ETTR twice."""
    out: dict[str, tuple[float, float]] = {}
    for arm in arms:
        fi, fd = arm.false_interruptions_ci95, arm.false_drains_ci95
        if fi is None and fd is None:
            e = run_arms(model, [arm], [interval_s], replicas, seed)["arms"][arm.name][0]["ettr"]
            out[arm.name] = (e, e)
            continue
        ends = []
        for j in (1, 0):
            end = replace(
                arm,
                name=f"{arm.name} {j}",
                false_interruptions_per_node_day=(
                    fi[j] if fi is not None else arm.false_interruptions_per_node_day
                ),
                false_drains_per_node_day=fd[j]
                if fd is not None
                else arm.false_drains_per_node_day,
            )
            res = run_arms(model, [end], [interval_s], replicas, seed)
            ends.append(res["arms"][end.name][0]["ettr"])
        out[arm.name] = (ends[0], ends[1])
    return out


# ---- report


def _charged(rate: float, ci: tuple[float, float] | None, measured: bool) -> str:
    if not measured:
        return "not measured (0 assumed)"
    return f"{rate:.3g}" + ("" if ci is None else f" [{ci[0]:.3g}, {ci[1]:.3g}]")


def render_charges(
    res: dict[str, Any],
    arms: list[Arm],
    ranges: dict[str, tuple[float, float]],
    model: Model,
    headline_min: float,
    nhc_drains_measured: bool,
) -> str:
    """The headline's charges, alike for every arm: each arm's false rates are the point
    estimates of the same soak with their two-sided 95 % intervals, and its ETTR is shown at the
    point and over those intervals. The soak's one-sided upper bounds are what-if rows only."""
    h = res["intervals_min"].index(headline_min)
    lines = [
        f"Every arm charged alike ({headline_min:g}-minute checkpoints): false interruptions and "
        "false drains per node-day are point estimates (count / node-days of the same soak) "
        "with their two-sided 95 % intervals (Garwood); the ETTR range is the ETTR with both "
        "rates at the upper ends and at the lower ends of those intervals (same failures). A "
        "falsely drained node is out of the pool for the soak's mean drain length; a restart "
        f"needs the job's {model.nodes:,} nodes, so when more nodes are out (repair or false "
        f"drain) than the {model.spare_nodes} spares it waits for the ones it lacks. The "
        "one-sided upper bounds appear only in the what-if rows below.",
        "",
        "| arm | ETTR (point rates, ± replicas' 95 % CI) | ETTR over the rates' 95 % "
        "intervals | false interruptions per node-day [95 % CI] | false drains per node-day "
        "[95 % CI] | false-drained nodes out at once (mean) |",
        "|---|---|---|---|---|---|",
    ]
    for arm in arms:
        x = res["arms"][arm.name][h]
        lo, hi = ranges.get(arm.name, (x["ettr"], x["ettr"]))
        nhc = arm.name.startswith("NHC")
        fi = (
            "0 (never touches the job)"
            if not arm.acts_on_job
            else _charged(arm.false_interruptions_per_node_day, arm.false_interruptions_ci95, True)
        )
        fd = _charged(
            arm.false_drains_per_node_day,
            arm.false_drains_ci95,
            measured=not nhc or nhc_drains_measured or arm.false_drains_ci95 is not None,
        )
        if arm.name in ("no health tool", IDEAL):
            fi = fd = "0 (by definition)"
        out = x.get("false_drain_node_hours", 0.0) / (model.horizon_s / 3600)
        lines.append(
            f"| {arm.name} | {x['ettr'] * 100:.2f} ± {x['ci95'] * 100:.2f} % | "
            f"{lo * 100:.2f} - {hi * 100:.2f} % | {fi} | {fd} | {out:.2f} |"
        )
    return "\n".join(lines) + "\n"


def paired_gain(a: list[float], b: list[float]) -> tuple[float, float]:
    return ci95(np.array(a) - np.array(b))


def render_md(res: dict[str, Any], model: Model, notes: list[str], headline_min: float) -> str:
    arms = list(res["arms"])
    ivs = res["intervals_min"]
    h = ivs.index(headline_min)
    base = res["arms"]["no health tool"][h]
    lines = [
        "## ETTR: what the health tool is worth to one large training job",
        "",
        f"Simulated: one job on {model.gpus:,} GPUs for {model.days:g} days, failures at the "
        f"Llama 3 405B rates (bench/data/ettr_inputs.toml), {len(base['ettr_samples'])} "
        f"replicas, checkpoint write {model.write_s:g} s, restart {model.restart_s:g} s. "
        "ETTR = training time kept / wall time; ± is the 95 % confidence interval.",
        "",
        "| arm | " + " | ".join(f"ckpt {m:g} min" for m in ivs) + " |",
        "|---|" + "---|" * len(ivs),
    ]
    for a in arms:
        cells = [f"{x['ettr'] * 100:.2f} ± {x['ci95'] * 100:.2f} %" for x in res["arms"][a]]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Input, not a result: the failure rates are Llama 3's 419 unexpected and 47 planned "
        "interruptions in 54 days on 16,384 GPUs (Table 5); the simulation draws "
        f"{base['unexpected_mean']:.0f} and {base['planned_mean']:.0f} per run on average (a "
        "check of the sampler). No arm is measured against Llama 3's own > 90 % ETTR.",
        "",
        "| arm | ETTR gain over no tool (paired, 95 % CI) | GPU-hours kept per run | "
        "false interruptions per run (hours lost) | false drains per run (node-hours out) | "
        "node-hours out for repair | lost hours: biggest causes |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in arms:
        x = res["arms"][a][h]
        g, gh = paired_gain(x["ettr_samples"], base["ettr_samples"])
        gpu_h = g * model.horizon_s / 3600 * model.gpus
        top = ", ".join(f"{k} {v:.1f}" for k, v in list(x["lost_hours"].items())[:4])
        fi = f"{x['wrong_drains_mean']:.1f} ({x['lost_hours'].get(WRONG_DRAIN, 0.0):.1f} h)"
        fd = f"{x.get('false_drains_mean', 0.0):.1f} ({x.get('false_drain_node_hours', 0.0):.1f})"
        out = f"{x.get('node_hours_out', 0.0):,.0f}"
        lines.append(
            f"| {a} | {g * 100:+.2f} ± {gh * 100:.2f} pp | {gpu_h:,.0f} | {fi} | {fd} | {out} "
            f"| {top} |"
        )
    if SELF_HEAL in res["arms"] and "babysitter" in res["arms"]:
        on, off = res["arms"][SELF_HEAL][h], res["arms"]["babysitter"][h]
        g, gh = paired_gain(on["ettr_samples"], off["ettr_samples"])
        lines += [
            "",
            "Self-healing, both arms: `babysitter` has a human reboot a node drained for a "
            f"reboot- or reset-class fault after {model.human_response_s[0] / 60:g}-"
            f"{model.human_response_s[1] / 60:g} min (today's human response), "
            f"`{SELF_HEAL}` has babysitter's loop do it in its measured time; either way the "
            f"reboot takes {model.reboot_s[0] / 60:g}-{model.reboot_s[1] / 60:g} min and other "
            f"faults wait {model.hardware_repair_s[0] / 86400:g}-"
            f"{model.hardware_repair_s[1] / 86400:g} days for a repair. Nodes out for repair: "
            f"{off.get('node_hours_out', 0.0):,.0f} -> {on.get('node_hours_out', 0.0):,.0f} "
            f"node-hours per run. The job restarts on one of {model.spare_nodes} hot spares and "
            f"waits for a repaired node only when none is free: ETTR {g * 100:+.2f} ± "
            f"{gh * 100:.2f} pp with self-healing (paired).",
        ]
    lines += ["", "Where the inputs came from:", ""] + [f"- {n}" for n in notes]
    lines += ["", "XID coverage, derived from the product's catalog (babysitter/hardware/xids.py):"]
    lines += [""] + [f"- {n}" for n in xid_coverage(load_inputs())]
    lines += ["", "![ETTR](results/ettr.png)", ""]
    return "\n".join(lines)


def plot(res: dict[str, Any], headline_min: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(res["arms"])
    ivs = res["intervals_min"]
    h = ivs.index(headline_min)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, 5.5), gridspec_kw={"width_ratios": [1, 1.3]})
    for a in arms:
        ys = [x["ettr"] * 100 for x in res["arms"][a]]
        es = [x["ci95"] * 100 for x in res["arms"][a]]
        ax1.errorbar(ivs, ys, yerr=es, marker="o", capsize=3, label=a)
    ax1.set_xscale("log")
    ax1.set_xticks(ivs, [f"{m:g}" for m in ivs])
    ax1.set_xlabel("checkpoint interval (minutes)")
    ax1.set_ylabel("ETTR (%)")
    ax1.set_title("ETTR vs checkpoint interval (95 % CI)")
    ax1.grid(alpha=0.3)
    ax1.legend()
    # lost-time breakdown at the headline interval: the causes that matter most, rest grouped
    totals: dict[str, float] = defaultdict(float)
    for a in arms:
        for k, v in res["arms"][a][h]["lost_hours"].items():
            totals[k] += v
    keys = [k for k, _ in sorted(totals.items(), key=lambda kv: -kv[1])][:9]
    left = np.zeros(len(arms))
    cmap = plt.get_cmap("tab10")
    for j, k in enumerate([*keys, "other"]):
        vals = np.array(
            [
                sum(v for kk, v in res["arms"][a][h]["lost_hours"].items() if kk not in keys)
                if k == "other"
                else res["arms"][a][h]["lost_hours"].get(k, 0.0)
                for a in arms
            ]
        )
        ax2.barh(arms, vals, left=left, label=k, color=cmap(j % 10))
        left += vals
    ax2.invert_yaxis()
    ax2.set_xlabel(f"wall-clock hours lost per run ({headline_min:g}-min checkpoints)")
    ax2.set_title("Lost time by cause")
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _set(path: str, value: Any) -> Any:
    def mutate(inp: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        d = inp
        for k in parents:
            d = d[k]
        d[leaf] = value

    return mutate


FD_KEY = "babysitter.false_interruptions_per_node_day"
UPPER = "babysitter charged the soak's one-sided 95 % upper bounds (before #40)"
# What-ifs on the assumptions that move the answer most (label, changes to the inputs).
VARIANTS: list[tuple[str, list[Any]]] = [
    ("as in the data file", []),
    ("NHC also reads XID events (a site XID check)", [_set("class.xid.nhc_reads_xids", True)]),
    (UPPER, [_set("babysitter.charge", "upper")]),
    (
        f"{UPPER}, NHC also reads XID events",
        [_set("babysitter.charge", "upper"), _set("class.xid.nhc_reads_xids", True)],
    ),
    (
        "NHC false drains 0.01 per node-day (not measured; for scale)",
        [_set("nhc.false_drains_per_node_day", 0.01)],
    ),
    *[
        (f"babysitter false interruptions {r:g} per node-day", [_set(FD_KEY, r)])
        for r in (1e-4, 1e-3, 1e-2)
    ],
    (
        "XID coverage: babysitter drains every XID-class fault (the old model's credit)",
        [_set("babysitter.xid_drain_all", True)],
    ),
    (
        "XID coverage: site override 74 = inspect (NVLink XID 74 alert only, as before #41)",
        [_set("babysitter.xid_overrides", {"74": "inspect"})],
    ),
    ("only 4 hot spare nodes", [_set("repair.spare_nodes", 4)]),
    ("humans answer in 5-30 min", [_set("timing.human_response_s", [300, 1800])]),
    ("humans answer in 1-8 h", [_set("timing.human_response_s", [3600, 28800])]),
    ("no undetectable share (checks see every GPU fault)", [_set("undetectable", 0)]),
    (
        "fast checkpoints: 10 s write, 120 s restart",
        [_set("checkpoint.write_s", 10), _set("checkpoint.restart_s", 120)],
    ),
]


def sensitivity(
    inp: dict[str, Any], interval_s: float, replicas: int, seed: int
) -> list[dict[str, Any]]:
    """ETTR of every arm at one interval under each variant of the assumptions."""
    out = []
    for label, changes in VARIANTS:
        v = copy.deepcopy(inp)
        for change in changes:
            change(v)
        if v.pop("undetectable", None) == 0:  # spread its share over the cause's other classes
            for c in v["cause"]:
                cl = {k: x for k, x in c["classes"].items() if k != "undetectable"}
                total = sum(cl.values())
                c["classes"] = {k: x / total for k, x in cl.items()}
        model = build_model(v)
        arms, _ = build_arms(v)
        res = run_arms(model, arms, [interval_s], replicas, seed)
        row: dict[str, Any] = {"variant": label}
        for a, per in res["arms"].items():
            row[a] = per[0]["ettr"]
        bs, nhc = res["arms"]["babysitter"][0], res["arms"]["NHC every 300 s"][0]
        g, gh = paired_gain(bs["ettr_samples"], nhc["ettr_samples"])
        row["babysitter_minus_nhc300_pp"] = g * 100
        row["ci95_pp"] = gh * 100
        out.append(row)
    return out


def render_sensitivity(rows: list[dict[str, Any]], headline_min: float, replicas: int) -> str:
    arms = [k for k in rows[0] if k not in ("variant", "babysitter_minus_nhc300_pp", "ci95_pp")]
    lines = [
        f"What-ifs on the assumptions ({headline_min:g}-minute checkpoints, {replicas} replicas "
        "each; ETTR in %):",
        "",
        "| variant | " + " | ".join(arms) + " | babysitter - NHC 300 s (pp, 95 % CI) |",
        "|---|" + "---|" * (len(arms) + 1),
    ]
    for r in rows:
        cells = [f"{r[a] * 100:.1f}" for a in arms]
        lines.append(
            f"| {r['variant']} | "
            + " | ".join(cells)
            + f" | {r['babysitter_minus_nhc300_pp']:+.2f} ± {r['ci95_pp']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=200)
    ap.add_argument("--seed", type=int, default=20240723)
    ap.add_argument("--sensitivity-replicas", type=int, default=100)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    inp = load_inputs()
    model = build_model(inp)
    arms, notes = build_arms(inp)
    for n in notes:
        print(n, flush=True)
    ivs = [float(m) * 60 for m in inp["checkpoint"]["sweep_min"]]
    headline = float(inp["checkpoint"]["headline_min"])
    res = run_arms(model, arms, ivs, args.replicas, args.seed)
    h = res["intervals_min"].index(headline)
    base = res["arms"]["no health tool"][h]
    ranges = rate_intervals(model, arms, headline * 60, args.replicas, args.seed)
    nhc_measured = "false_drains_per_node_day" in inp["nhc"]
    bs_x, nhc_x = res["arms"]["babysitter"][h], res["arms"]["NHC every 300 s"][h]
    diff, diff_ci = paired_gain(bs_x["ettr_samples"], nhc_x["ettr_samples"])
    diff_range = (
        ranges["babysitter"][0] - ranges["NHC every 300 s"][1],
        ranges["babysitter"][1] - ranges["NHC every 300 s"][0],
    )
    figures = [
        figure(
            f"ETTR difference, babysitter - NHC every 300 s, {headline:g}-min checkpoints "
            "(simulated, every arm charged its point false rates)",
            diff * 100,
            "pp",
            ci95=diff_ci * 100,
            over_rate_intervals_pp=[diff_range[0] * 100, diff_range[1] * 100],
        )
    ]
    for a, per in res["arms"].items():
        x = per[h]
        g, gh = paired_gain(x["ettr_samples"], base["ettr_samples"])
        figures.append(
            figure(
                f"ETTR, {a}, {headline:g}-min checkpoints (simulated, Llama 3 rates)",
                x["ettr"],
                "fraction",
                baseline="no health tool",
                baseline_value=base["ettr"],
                ci95=x["ci95"],
                over_rate_intervals=list(ranges.get(a, (x["ettr"], x["ettr"]))),
                gain_pp=g * 100,
                gain_ci95_pp=gh * 100,
                n=len(x["ettr_samples"]),
            )
        )
    figures.append(
        figure(
            "ETTR model input check: unexpected interruptions drawn per 54-day run",
            base["unexpected_mean"],
            "interruptions",
            baseline="input: Llama 3 Table 5",
            baseline_value=419.0,
        )
    )
    slim = {
        a: [{k: v for k, v in x.items() if k != "ettr_samples"} for x in per]
        for a, per in res["arms"].items()
    }
    sens = sensitivity(inp, headline * 60, args.sensitivity_replicas, args.seed)
    md = render_md(res, model, notes, headline)
    md = md.replace(
        "\nInput, not a result",
        "\n"
        + render_charges(res, arms, ranges, model, headline, nhc_measured)
        + f"\nbabysitter - NHC every 300 s: {diff * 100:+.2f} ± {diff_ci * 100:.2f} pp (paired, "
        f"point rates); {diff_range[0] * 100:+.2f} to {diff_range[1] * 100:+.2f} pp over the "
        "rates' 95 % intervals.\n\nInput, not a result",
        1,
    )
    md = md.replace(
        "\nWhere the inputs",
        "\n" + render_sensitivity(sens, headline, args.sensitivity_replicas) + "\nWhere the inputs",
        1,
    )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "ettr.md").write_text(md)
    plot(res, headline, RESULTS_DIR / "ettr.png")
    write_result(
        "ettr",
        figures,
        {
            "arms": slim,
            "intervals_min": res["intervals_min"],
            "replicas": args.replicas,
            "seed": args.seed,
            "inputs_notes": notes,
            "sensitivity": sens,
            "rate_interval_ettr": {a: list(v) for a, v in ranges.items()},
            "babysitter_minus_nhc300_pp": {
                "point": diff * 100,
                "ci95": diff_ci * 100,
                "over_rate_intervals": [diff_range[0] * 100, diff_range[1] * 100],
            },
            "inputs": str(INPUTS.relative_to(BENCH_DIR.parent)),
        },
        settings={
            "replicas": args.replicas,
            "sensitivity_replicas": args.sensitivity_replicas,
            "seed": args.seed,
            "inputs": str(INPUTS.relative_to(BENCH_DIR.parent)),
            "babysitter_false_interruptions_per_node_day": next(
                a.false_interruptions_per_node_day for a in arms if a.name == "babysitter"
            ),
            "babysitter_false_drains_per_node_day": next(
                a.false_drains_per_node_day for a in arms if a.name == "babysitter"
            ),
        },
        duration_s=round(time.monotonic() - t0, 1),
    )
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
