"""InfiniBand check over a generated sysfs tree (the check reads it like the real one)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from babysitter.checks.base import CheckContext
from babysitter.checks.infiniband.check import InfinibandCheck, parse_rate, parse_state
from babysitter.config import parse_config
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


def test_link_downed_increase_is_critical_and_reset_is_not(tmp_path):
    simib.make_tree(tmp_path)
    clock = Clock()
    chk = make(tmp_path, clock)
    chk.run()
    clock.t += 30
    simib.bump_counter(tmp_path, "mlx5_2", 1, "link_downed")
    assert ("ib:mlx5_2/1", "ib.link_downed", "critical") in bad(chk.run())
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


def test_three_flaps_sticky_until_window_passes(tmp_path):
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
