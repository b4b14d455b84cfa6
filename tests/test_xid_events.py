"""XID events through NVML (nvmlEventSetWait_v2 in one thread) and garbage input."""

from __future__ import annotations

import json
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from babysitter.checks.xid.check import parse_kmsg_line
from babysitter.devcluster import fakenvml
from babysitter.hardware.xids import classify
from tests.fixtures.gpu import babysitter_env, run_babysitter

EVENT_SCRIPT = """
import json, sys, time
from babysitter.config import load_config, parse_config
from babysitter.checks.base import CheckContext
from babysitter.checks.xid.check import NvmlXidEvents
cfg = load_config()
src = NvmlXidEvents(CheckContext(cfg, "n1"))
src.start(lambda fs: [print(json.dumps(f.to_json_dict()), flush=True) for f in fs])
# ready once the thread has registered on every GPU (its health says so), not after a guess:
# under a loaded machine's scheduling the XIDs came before the registration and were missed
deadline = time.monotonic() + 60
while not any(f.code == "events.running" for f in src.health()):
    assert time.monotonic() < deadline, src.health()
    time.sleep(0.01)
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
src.stop()
"""


def test_nvml_xid_event_is_emitted_at_once(gpus, fakenvml_lib, tmp_path):
    env = babysitter_env(gpus, fakenvml_lib, tmp_path)
    p = subprocess.Popen(
        [sys.executable, "-c", EVENT_SCRIPT, "20"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        gpus.xid(3, 79)
        gpus.xid(4, 13)
        first = json.loads(p.stdout.readline())
        second = json.loads(p.stdout.readline())
    finally:
        p.kill()
        p.wait(timeout=10)
    assert first["component"] == "gpu3" and first["code"] == "xid.79"
    assert first["severity"] == "critical" and first["action"] == "reboot"
    assert first["details"]["uuid"].startswith("GPU-")
    assert second["code"] == "xid.13" and second["severity"] == "info"


def test_catalog_classes():
    assert classify(79).action == "reboot"
    assert classify(48).action == "reset_gpu"
    assert classify(13).severity == "info"
    assert classify(43).severity == "ok"
    assert classify(99999).severity == "warning"


@given(st.text(max_size=400))
def test_kmsg_garbage_never_crashes(line):
    parse_kmsg_line(line)


@given(st.integers(min_value=-(2**70), max_value=2**70), st.text(max_size=40))
def test_kmsg_xid_numbers_of_any_size(n, rest):
    parse_kmsg_line(f"NVRM: Xid (PCI:0000:3b:00): {n}, {rest}")


@settings(max_examples=15, deadline=None)
@given(st.binary(max_size=2000))
def test_kmsg_file_garbage_gives_findings_not_a_crash(tmp_path_factory, data):
    from babysitter.checks.base import CheckContext
    from babysitter.checks.xid.check import KmsgXidCheck
    from babysitter.config import parse_config

    p = tmp_path_factory.mktemp("k") / "kmsg"
    p.write_bytes(data + b"\nNVRM: Xid (PCI:0000:3b:00): 79, x\n")
    cfg = parse_config({"agent": {"kmsg_path": str(p)}})
    findings = KmsgXidCheck(CheckContext(cfg, "n")).run()
    assert any(f.code == "xid.79" for f in findings)


def test_garbage_nvml_strings_do_not_crash_the_run(gpus, fakenvml_lib, tmp_path):
    gpus.set(0, name="\x07NVIDIA\x01 H100\x1b[31m", uuid="GPU-\x00\x02bad", serial="\xff")
    env = babysitter_env(gpus, fakenvml_lib, tmp_path)
    r = run_babysitter(env, "check", "--json", "--only", "gpu")
    assert r.returncode == 0, r.stderr
    findings = json.loads(r.stdout)
    msg = next(f["message"] for f in findings if f["component"] == "gpu0")
    assert msg.isprintable()


def test_slow_call_does_not_block_event_thread(gpus, fakenvml_lib, tmp_path):
    """A hung unrelated call (power) must not stop XID events from arriving."""
    gpus.delay("nvmlDeviceGetPowerUsage", 30)
    env = babysitter_env(gpus, fakenvml_lib, tmp_path)
    p = subprocess.Popen(
        [sys.executable, "-c", EVENT_SCRIPT, "20"], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        gpus.xid(2, 48)
        f = json.loads(p.stdout.readline())
    finally:
        p.kill()
        p.wait(timeout=10)
    assert f["component"] == "gpu2" and f["action"] == "reset_gpu"


def test_xid_at_the_end_of_a_100_mb_log_is_found_in_bounded_memory(tmp_path):
    import tracemalloc

    from babysitter.checks.base import CheckContext
    from babysitter.checks.xid.check import KmsgXidCheck
    from babysitter.config import parse_config

    log = tmp_path / "kern.log"
    filler = b"[12345.678] eth0: link is up, nothing to see here, carry on\n" * 16_384  # 0.94 MiB
    with log.open("wb") as f:
        for _ in range(110):
            f.write(filler)
        f.write(b"[99999.000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n")
    assert log.stat().st_size > 100 * 1024 * 1024
    cfg = parse_config({"agent": {"kmsg_path": str(log)}})
    check = KmsgXidCheck(CheckContext(cfg, "n"))
    tracemalloc.start()
    try:
        found = check.run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [f.code for f in found if f.code.startswith("xid.")] == ["xid.79"]
    assert peak < 8 * 1024 * 1024, f"peak {peak / 2**20:.1f} MiB while reading a 100 MB log"


def test_a_line_across_a_read_boundary_is_never_split(tmp_path):
    from babysitter.checks.xid.check import read_log_lines

    log = tmp_path / "kern.log"
    log.write_bytes(
        b"noise\nNVRM: Xid (PCI:0000:3b:00): 79, pid=1\nNVRM: Xid (PCI:0000:3c:00): 48, x\npart"
    )
    for chunk in (1, 3, 7, 16, 33, 4096):
        with log.open("rb") as fh:
            lines, offset = read_log_lines(fh, 0, chunk=chunk)
        assert [parse_kmsg_line(x)[1] for x in lines] == [79, 48], chunk  # type: ignore[index]
        assert offset == log.stat().st_size - len(b"part")  # the incomplete line: read again
    with log.open("ab") as f:
        f.write(b"ial NVRM: Xid (PCI:0000:3b:00): 31, y\n")
    with log.open("rb") as fh:
        lines, _ = read_log_lines(fh, offset, chunk=5)
    assert [parse_kmsg_line(x)[1] for x in lines] == [31]  # type: ignore[index]


def test_a_malformed_xid_line_never_hides_the_real_xids_after_it(tmp_path):
    """An absurdly long XID number used to raise and lose every line after it (the offset had
    already moved past them); non-ASCII digits were read as an XID number."""
    from babysitter.checks.base import CheckContext
    from babysitter.checks.xid.check import KmsgXidCheck
    from babysitter.config import parse_config

    log = tmp_path / "kern.log"
    log.write_text(
        "NVRM: Xid (PCI:0000:3b:00): " + "9" * 4000 + ", pid=1, overflow\n"
        "NVRM: Xid (PCI:0000:18:00): \u0664\u0668, pid=2, Arabic-Indic 48\n"
        "NVRM: Xid (PCI:0000:5d:00): 79, pid=3, GPU has fallen off the bus.\n"
    )
    check = KmsgXidCheck(CheckContext(parse_config({"agent": {"kmsg_path": str(log)}}), "n"))
    first = check.run()
    assert [(f.code, f.severity) for f in first] == [("xid.79", "critical")]
    assert [f.code for f in check.run()] == ["xid.79"]  # still open, nothing read twice


def test_kmsg_xid_numbers_are_ascii_and_bounded():
    assert parse_kmsg_line("NVRM: Xid (PCI:0000:3b:00): \u0667\u0669, x") is None
    assert parse_kmsg_line("NVRM: Xid (PCI:0000:3b:00): 1234567, x") is None
    assert parse_kmsg_line("NVRM: Xid (PCI:0000:3b:00): 154, x") == ("0000:3b:00", 154, "x")


HEALTH_SCRIPT = """
import json, sys, threading
from babysitter.config import load_config
from babysitter.checks.base import CheckContext
from babysitter.checks.xid.check import NvmlEvents
src = NvmlEvents(CheckContext(load_config(), "n1"))
out = threading.Lock()
def say(kind, fs):
    with out:
        for f in fs:
            print(kind, json.dumps(f.to_json_dict()), flush=True)
print("supported", src.supported(), flush=True)
src.on_health = lambda s, fs: say("health", fs)
src.start(lambda fs: say("event", fs))
sys.stdin.readline()  # the test closes stdin when done
src.stop()
"""


def test_an_event_source_that_cannot_start_says_so_and_retries_until_it_runs(
    gpus, fakenvml_lib, tmp_path
):
    """The driver does not answer when the agent starts (not loaded yet): the event source is
    started anyway, reports a degraded agent, retries with backoff, and once NVML answers it
    runs and delivers XIDs."""
    gpus.set(init_error=fakenvml.DRIVER_NOT_LOADED)
    env = babysitter_env(gpus, fakenvml_lib, tmp_path)
    p = subprocess.Popen(
        [sys.executable, "-c", HEALTH_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )

    def line() -> tuple[str, dict]:
        assert p.stdout is not None
        kind, _, body = p.stdout.readline().partition(" ")
        return kind, json.loads(body)

    try:
        assert p.stdout is not None
        assert p.stdout.readline().split() == ["supported", "True"]
        kind, degraded = line()
        assert kind == "health" and degraded["code"] == "agent.degraded", degraded
        assert degraded["severity"] == "warning" and "NVML" in degraded["message"]
        gpus.set(init_error=None)  # the driver is loaded now
        while (got := line())[1]["code"] == "agent.degraded":
            pass  # more attempts may fail before the next retry sees the driver
        assert got[0] == "health" and got[1]["code"] == "events.running"
        assert got[1]["severity"] == "ok"
        gpus.xid(3, 79)
        kind, xid = line()
        assert kind == "event" and xid["code"] == "xid.79" and xid["component"] == "gpu3"
    finally:
        p.kill()
        p.wait(timeout=10)
