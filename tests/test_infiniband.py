"""InfiniBand check over a generated sysfs tree (the check reads it like the real one)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from babysitter.checks.base import CheckContext
from babysitter.checks.infiniband.check import InfinibandCheck, parse_rate, parse_state
from babysitter.config import parse_config
from babysitter.controller.loop.decide.node.verdict import drain_worthy
from babysitter.devcluster import simib


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(root: Path, clock: Clock, **ib) -> InfinibandCheck:
    cfg = parse_config(
        {
            "agent": {"sysfs_root": str(root), "hardware_profile": "h100-sxm"},
            "checks": {"infiniband": ib},
        }
    )
    return InfinibandCheck(CheckContext(cfg, "n1"), clock=clock)


def bad(findings):
    return [(f.component, f.code, str(f.severity)) for f in findings if f.severity != "ok"]


def test_eight_active_400g_ports_no_finding(tmp_path):
    simib.make_tree(tmp_path)
    chk = make(tmp_path, Clock())
    assert bad(chk.run()) == []


def test_one_port_down_is_critical_on_that_port(tmp_path):
    simib.make_tree(tmp_path)
    simib.set_port(tmp_path, "mlx5_3", active=False)
    out = bad(make(tmp_path, Clock()).run())
    assert ("ib:mlx5_3/1", "ib.port_down", "critical") in out


def test_rate_200_instead_of_400(tmp_path):
    simib.make_tree(tmp_path)
    simib.set_port(tmp_path, "mlx5_5", rate_gbps=200)
    assert bad(make(tmp_path, Clock()).run()) == [("ib:mlx5_5/1", "ib.rate_degraded", "warning")]


def test_a_link_downed_increase_is_a_flap_warning_and_a_reset_is_nothing(tmp_path):
    simib.make_tree(tmp_path)
    clock = Clock()
    chk = make(tmp_path, clock)
    chk.run()
    clock.t += 30
    simib.bump_counter(tmp_path, "mlx5_2", 1, "link_downed")  # a retrain between two reads
    out = chk.run()
    assert ("ib:mlx5_2/1", "ib.link_downed", "warning") in bad(out)
    assert not any(map(drain_worthy, out))
    clock.t += 30
    assert bad(chk.run()) == []
    simib.set_counter(tmp_path, "mlx5_2", 1, "symbol_error", 0)  # counters reset: no alert
    clock.t += 30
    assert bad(chk.run()) == []


def test_rate_counters(tmp_path):
    simib.make_tree(tmp_path)
    clock = Clock()
    chk = make(tmp_path, clock)
    chk.run()
    clock.t += 60
    simib.bump_counter(tmp_path, "mlx5_1", 1, "symbol_error", 5)  # 5/min = 300/h > 120/h
    simib.bump_counter(tmp_path, "mlx5_4", 1, "port_rcv_errors", 10)  # 10/min < 10/s
    assert bad(chk.run()) == [("ib:mlx5_1/1", "ib.symbol_error", "warning")]


def test_repeated_flaps_stay_sticky_until_the_window_passes(tmp_path):
    simib.make_tree(tmp_path)
    clock = Clock()
    chk = make(tmp_path, clock)
    chk.run()
    for _ in range(3):
        clock.t += 30
        simib.set_port(tmp_path, "mlx5_6", active=False)
        chk.run()
        clock.t += 30
        simib.set_port(tmp_path, "mlx5_6", active=True)
        out = bad(chk.run())
    assert ("ib:mlx5_6/1", "ib.port_flapping", "critical") in out
    clock.t += 300
    assert ("ib:mlx5_6/1", "ib.port_flapping", "critical") in bad(chk.run())  # still sticky
    clock.t += 301
    assert bad(chk.run()) == []


def test_opt_in_recovery_window_forgives_a_stable_port(tmp_path):
    simib.make_tree(tmp_path)
    clock = Clock()
    chk = make(tmp_path, clock, flap_recovery_s=120)
    chk.run()
    for _ in range(3):
        clock.t += 10
        simib.set_port(tmp_path, "mlx5_6", active=False)
        chk.run()
        clock.t += 10
        simib.set_port(tmp_path, "mlx5_6", active=True)
        chk.run()
    clock.t += 121
    assert bad(chk.run()) == []


def test_missing_devices_is_a_finding(tmp_path):
    out = bad(make(tmp_path, Clock()).run())
    assert out == [("host", "ib.missing", "critical")]


@settings(max_examples=200)
@given(st.text(max_size=50))
def test_parsers_take_garbage(s):
    parse_state(s)
    parse_rate(s)


def test_garbage_files_become_findings_not_crashes(tmp_path):
    simib.make_tree(tmp_path, devices=2)
    d = simib.port_dir(tmp_path, "mlx5_0")
    (d / "state").write_bytes(b"\xff\xfe garbage")
    (d / "rate").write_text("fast")
    (d / "counters" / "link_downed").write_text("-3")
    out = bad(make(tmp_path, Clock(), expected_ports=2).run())
    assert ("ib:mlx5_0/1", "ib.port_down", "critical") in out


# ---- flap hygiene: a port back within NCCL's retry budget is a flap, not a fault

HOLD = parse_config({}).checks.infiniband.port_down_hold_s


def step(chk: InfinibandCheck, clock: Clock, seconds: float) -> list:
    """Run the check once a second (the fast tier's pace) for `seconds`; every run's findings."""
    out = []
    for _ in range(int(seconds)):
        clock.t += 1
        out.extend(chk.run())
    return out


def flap(root: Path, chk: InfinibandCheck, clock: Clock, dev: str, down_s: float) -> list:
    simib.set_port(root, dev, active=False)
    simib.bump_counter(root, dev, 1, "link_downed")  # the HCA counts the link going down
    out = step(chk, clock, down_s)
    simib.set_port(root, dev, active=True)
    return out + step(chk, clock, 1)


def test_the_hold_window_defaults_to_nccls_ib_retry_budget():
    # 4.096 us x 2^NCCL_IB_TIMEOUT (20) per retry, NCCL_IB_RETRY_CNT (7) retries: NCCL's
    # "approximately 30 seconds", ending before the 8th timeout (34.4 s) errors the QP
    assert abs(HOLD - 4.096e-6 * 2**20 * 7) < 0.01
    assert 30 < HOLD < 4.096e-6 * 2**20 * 8


def test_a_flap_shorter_than_the_hold_window_warns_and_never_drains(tmp_path):
    simib.make_tree(tmp_path)
    clock = Clock()
    chk = make(tmp_path, clock)
    chk.run()
    during = flap(tmp_path, chk, clock, "mlx5_3", HOLD - 2)
    assert ("ib:mlx5_3/1", "ib.port_down", "warning") in bad(during)
    assert not any(map(drain_worthy, during))
    # the counter read after it sees the same flap, not a second one (and no drain)
    after = step(chk, clock, 60)
    assert {c for _, c, _ in bad(after)} <= {"ib.link_downed"}
    assert not any(map(drain_worthy, after))
    assert bad(step(chk, clock, 31)) == []


def test_a_port_down_longer_than_the_hold_window_drains_when_it_ends(tmp_path):
    simib.make_tree(tmp_path)
    clock = Clock()
    chk = make(tmp_path, clock)
    chk.run()
    simib.set_port(tmp_path, "mlx5_3", active=False)
    down_at = clock.t + 1
    held = step(chk, clock, int(HOLD))  # the reads of the hold's first whole seconds
    assert not any(map(drain_worthy, held))
    first = next(f for f in step(chk, clock, 2) if drain_worthy(f))
    assert (first.component, first.code) == ("ib:mlx5_3/1", "ib.port_down")
    assert HOLD <= clock.t - down_at <= HOLD + 2
    assert first.details["port_guid"] and first.details["lid"]  # where it is in the fabric


def test_a_port_down_at_the_agents_first_read_drains_at_once(tmp_path):
    """No flap seen to start: a port down when the agent (re)starts is not held again."""
    simib.make_tree(tmp_path)
    simib.set_port(tmp_path, "mlx5_3", active=False)
    out = make(tmp_path, Clock()).run()
    assert any(drain_worthy(f) and f.code == "ib.port_down" for f in out)


def test_hold_zero_drains_a_port_down_at_once(tmp_path):
    simib.make_tree(tmp_path)
    clock = Clock()
    chk = make(tmp_path, clock, port_down_hold_s=0)
    chk.run()
    simib.set_port(tmp_path, "mlx5_3", active=False)
    assert ("ib:mlx5_3/1", "ib.port_down", "critical") in bad(step(chk, clock, 1))


def with_pci(root: Path, dev: str, pci: str) -> None:
    """The HCA's `device` link to its PCI function, as sysfs has it."""
    target = root / "sys" / "devices" / "pci0000:00" / pci
    target.mkdir(parents=True)
    (simib.port_dir(root, dev).parent.parent / "device").symlink_to(target)


def test_repeated_flaps_in_the_window_drain_naming_the_port_and_cable(tmp_path):
    simib.make_tree(tmp_path)
    with_pci(tmp_path, "mlx5_6", "0000:3b:00.0")
    clock = Clock()
    chk = make(tmp_path, clock)
    chk.run()
    first = flap(tmp_path, chk, clock, "mlx5_6", 5)
    assert not any(map(drain_worthy, first))  # one flap: a warning
    step(chk, clock, 100)
    second = flap(tmp_path, chk, clock, "mlx5_6", 5)  # the second within 5 minutes
    f = [f for f in second if f.code == "ib.port_flapping"][-1]
    assert drain_worthy(f) and f.component == "ib:mlx5_6/1"
    assert "flapped 2 times in 5 min" in f.message
    assert "cable at mlx5_6 port 1" in f.message and "0000:3b:00.0" in f.message
    assert f.details["pci"] == "0000:3b:00.0" and f.details["port_guid"].startswith("0x")


def test_flaps_further_apart_than_the_window_never_drain(tmp_path):
    simib.make_tree(tmp_path)
    clock = Clock()
    chk = make(tmp_path, clock)
    chk.run()
    out = flap(tmp_path, chk, clock, "mlx5_6", 5)
    out += step(chk, clock, 310)
    out += flap(tmp_path, chk, clock, "mlx5_6", 5)
    out += step(chk, clock, 60)
    assert not any(map(drain_worthy, out))


def test_link_downed_increases_the_state_reads_missed_are_flaps_too(tmp_path):
    """Retrains shorter than a state read (the counter alone saw them): each is a flap, and
    two within the window drain like any repeated flap."""
    simib.make_tree(tmp_path)
    clock = Clock()
    chk = make(tmp_path, clock)
    chk.run()
    simib.bump_counter(tmp_path, "mlx5_1", 1, "link_downed")
    once = step(chk, clock, 30)
    assert ("ib:mlx5_1/1", "ib.link_downed", "warning") in bad(once)
    assert not any(map(drain_worthy, once))
    simib.bump_counter(tmp_path, "mlx5_1", 1, "link_downed")
    twice = step(chk, clock, 30)
    assert ("ib:mlx5_1/1", "ib.port_flapping", "critical") in bad(twice)
