"""`make gpu-check`: babysitter against a real NVIDIA GPU and driver, for the day one is there.

On a machine with NVIDIA GPUs it runs, and writes to bench/results/gpu_check.json with the GPU
models and the driver:
1. every check of `babysitter check --json` against the real driver (a check that cannot read
   it, `check.error` or `*.nvml_error`, fails this step);
2. an NVML event wait on every GPU (register every supported event type, wait `--event-wait-s`);
3. the SDC test on every GPU through the agent's child-process path (checks/sdc/child.py) with
   torch and with cupy where installed: it must test every GPU NVML lists, on the GPU, and leave
   no process of ours on any GPU; then `babysitter check --only sdc.matmul` (the agent's check:
   the busy guard, then the same child);
4. `babysitter validate --json`;
5. the one-shot `babysitter check --json` cost (/usr/bin/time: CPU seconds, peak RSS);
6. the live agent beside a controller for `--live-s` (default 300 s): CPU share, RSS, and no
   agent process on any GPU.
Exit 0 when every step passed, 1 when one failed (the results say which), 2 when this is not a
GPU machine.

Without a GPU it refuses at once with one line (exit 2): no /dev/nvidia[0-9]* device, no
nvidia-smi, NVML not starting, or the environment pointing at babysitter's fake libnvidia-ml
(LD_LIBRARY_PATH or FAKE_NVML_STATE): this path never measures the fake. The refusal needs only
the standard library (`python3 bench/gpu_check.py --preflight` runs before the venv is built).

Run: make gpu-check   (or: python -m bench.gpu_check [--live-s S] [--event-wait-s S])"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEVICE_GLOB = "/dev/nvidia[0-9]*"
FAKE_MARK = b"FAKE_NVML_STATE"  # in the fake library's strings; never in NVIDIA's
SMI_FIELDS = "index,name,uuid,driver_version,memory.total,compute_mode,pci.bus_id"
EXIT_FAILED, EXIT_NO_GPU = 1, 2


class NoGpu(Exception):
    """Not a machine this check can run on (the one-line reason)."""


# ---- preflight: standard library only


def _is_fake(lib: Path) -> bool:
    try:
        return FAKE_MARK in lib.read_bytes()
    except OSError:
        return False


def refuse_fake(env: dict[str, str]) -> None:
    if env.get("FAKE_NVML_STATE"):
        raise NoGpu("FAKE_NVML_STATE is set: this environment uses babysitter's fake NVML")
    for d in filter(None, env.get("LD_LIBRARY_PATH", "").split(":")):
        lib = Path(d) / "libnvidia-ml.so.1"
        if _is_fake(lib):
            raise NoGpu(f"LD_LIBRARY_PATH points at babysitter's fake NVML ({lib})")


NVML_PROBE = r"""
import ctypes, json
lib = ctypes.CDLL("libnvidia-ml.so.1")
rc = lib.nvmlInit_v2()
if rc != 0:
    raise SystemExit(f"nvmlInit failed with NVML error {rc}")
n = ctypes.c_uint()
rc = lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
if rc != 0:
    raise SystemExit(f"nvmlDeviceGetCount failed with NVML error {rc}")
path = next((l.split()[-1] for l in open("/proc/self/maps") if "libnvidia-ml" in l), "")
print(json.dumps({"gpus": n.value, "library": path}))
"""


def preflight(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What the machine has; NoGpu with the reason when it is not an NVIDIA GPU machine."""
    env = dict(os.environ if env is None else env)
    refuse_fake(env)
    devices = sorted(glob.glob(DEVICE_GLOB))
    if not devices:
        raise NoGpu(f"no NVIDIA GPU here: no {DEVICE_GLOB} device")
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is None:
        raise NoGpu("nvidia-smi is not installed (no NVIDIA driver user space)")
    try:
        p = subprocess.run(
            [smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise NoGpu("nvidia-smi did not answer within 30 s") from None
    if p.returncode != 0:
        raise NoGpu(f"nvidia-smi failed: {(p.stderr or p.stdout).strip()[:200]}")
    keys = SMI_FIELDS.split(",")
    gpus = [
        dict(zip(keys, (v.strip() for v in line.split(",")), strict=False))
        for line in p.stdout.splitlines()
    ]
    try:
        probe = subprocess.run(
            [sys.executable, "-c", NVML_PROBE], capture_output=True, text=True, timeout=30, env=env
        )
    except subprocess.TimeoutExpired:
        raise NoGpu("NVML did not start within 30 s") from None
    if probe.returncode != 0:
        raise NoGpu(f"NVML does not start: {(probe.stderr or probe.stdout).strip()[-200:]}")
    nvml = json.loads(probe.stdout)
    if _is_fake(Path(nvml["library"])):
        raise NoGpu(f"the NVML library loaded is babysitter's fake ({nvml['library']})")
    if nvml["gpus"] == 0:
        raise NoGpu("NVML lists no GPU")
    return {"devices": devices, "nvidia_smi": gpus, "nvml": nvml}


# ---- the GPU path (the venv's babysitter)


def babysitter(
    env: dict[str, str], *args: str, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "babysitter.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def our_pids() -> set[int]:
    """This process and every process below it."""
    out, todo = set(), [os.getpid()]
    while todo:
        p = todo.pop()
        out.add(p)
        for task in os.listdir(f"/proc/{p}/task") if os.path.isdir(f"/proc/{p}") else []:
            try:
                todo += [
                    int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()
                ]
            except OSError:
                pass
    return out


def gpu_processes() -> dict[int, list[int]]:
    """Compute processes per GPU, from the real NVML."""
    from babysitter.checks import nvml

    ok, lost = nvml.devices()
    out: dict[int, list[int]] = {}
    for d in ok:
        procs = nvml.call(nvml.nv.nvmlDeviceGetComputeRunningProcesses, d.handle)
        out[d.index] = [] if procs is nvml.NOT_SUPPORTED else [int(p.pid) for p in procs]
    for lost_gpu in lost:
        out[lost_gpu.index] = [-1]  # lost: cannot tell
    return out


def step_checks(env: dict[str, str]) -> dict[str, Any]:
    from babysitter.finding import Finding, no_verdict

    t = time.monotonic()
    r = babysitter(env, "check", "--json", timeout=300)
    found = [Finding.from_dict(d) for d in json.loads(r.stdout or "[]")]
    blind = sorted({f"{f.check}: {f.code}" for f in found if no_verdict(f)})
    per_check: dict[str, list[str]] = {}
    for f in found:
        per_check.setdefault(f.check, []).append(f"{f.component} {f.severity.value} {f.code}")
    return {
        "ok": not blind,
        "why": f"checks that could not read the driver: {blind}" if blind else "",
        "exit_code": r.returncode,
        "seconds": round(time.monotonic() - t, 2),
        "findings": per_check,
        "stderr": r.stderr[-2000:],
    }


def step_events(wait_s: float) -> dict[str, Any]:
    from babysitter.checks import nvml

    nv = nvml.nv
    ok, lost = nvml.devices()
    es = nv.nvmlEventSetCreate()
    per_gpu: dict[int, Any] = {}
    try:
        for d in ok:
            try:
                mask = nv.nvmlDeviceGetSupportedEventTypes(d.handle)
                nv.nvmlDeviceRegisterEvents(d.handle, mask, es)
                per_gpu[d.index] = {"supported": hex(mask)}
            except nv.NVMLError as exc:
                per_gpu[d.index] = {"error": str(exc)}
        events, timeouts, errors = [], 0, []
        end = time.monotonic() + wait_s
        while time.monotonic() < end:
            try:
                e = nv.nvmlEventSetWait_v2(es, 1000)
                events.append({"type": hex(e.eventType), "data": int(e.eventData)})
            except nv.NVMLError_Timeout:
                timeouts += 1
            except nv.NVMLError as exc:
                errors.append(str(exc))
                break
    finally:
        nv.nvmlEventSetFree(es)
    failed = [i for i, g in per_gpu.items() if "error" in g]
    return {
        "ok": not errors and not failed and not lost,
        "why": f"errors: {errors}, GPUs not registered: {failed}, lost: {len(lost)}"
        if errors or failed or lost
        else "",
        "gpus": per_gpu,
        "events": events,
        "waits_timed_out": timeouts,
    }


def step_sdc(backend: str, gpus: int, work: Path) -> dict[str, Any]:
    import importlib.util

    from babysitter.checks.sdc import child

    if importlib.util.find_spec(backend) is None:
        return {"ok": None, "why": f"{backend} is not installed: not run"}
    req = child.ChildRequest(
        backend, 2048, "float32", 1234, state_dir=str(work), check_name="sdc.matmul"
    )
    try:
        out = child.run_child(req, timeout_s=600, max_rss_mb=16384)
    except child.ChildFailed as exc:
        return {"ok": False, "why": str(exc)}
    r = out.reply
    tested = sorted(d.device for d in r.devices if d.device.startswith("gpu"))
    left = {i: sorted(set(p) & our_pids()) for i, p in gpu_processes().items()}
    problems = []
    if not r.ok:
        problems.append(f"{r.error}: {r.message}")
    if len(tested) != gpus:
        problems.append(f"tested {len(tested)} GPU(s) of {gpus} ({r.library}: a CPU build?)")
    bad = [f"{f.component} {f.code}" for f in out.findings if f.code != "sdc.ok"]
    if bad:
        problems.append(f"not clean: {bad}")
    if any(left.values()):
        problems.append(f"our processes still on GPUs: {left}")
    return {
        "ok": not problems,
        "why": "; ".join(problems),
        "library": r.library,
        "devices": [
            {"device": d.device, "model": d.model, "gflops": round(d.gflops, 1)} for d in r.devices
        ],
        "codes": [f"{f.component} {f.code}" for f in out.findings],
        "child_peak_rss_mb": round(out.peak_rss_kb / 1024, 1),
        "child_seconds": round(out.duration_s, 2),
    }


def step_sdc_check(env: dict[str, str]) -> dict[str, Any]:
    r = babysitter(env, "check", "--only", "sdc.matmul", "--json", timeout=600)
    found = json.loads(r.stdout or "[]")
    codes = [f"{f['component']} {f['code']}" for f in found]
    left = {i: sorted(set(p) & our_pids()) for i, p in gpu_processes().items()}
    ok = r.returncode == 0 and any(c.endswith("sdc.ok") for c in codes) and not any(left.values())
    return {"ok": ok, "why": "" if ok else f"exit {r.returncode}: {codes}", "codes": codes}


def step_validate(env: dict[str, str]) -> dict[str, Any]:
    t = time.monotonic()
    r = babysitter(env, "validate", "--json", timeout=1800)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    res = json.loads(lines[-1]) if lines else {}
    return {
        "ok": r.returncode == 0 and bool(res.get("ok")),
        "why": "" if r.returncode == 0 else f"exit {r.returncode}: {res.get('failures')}",
        "result": res,
        "seconds": round(time.monotonic() - t, 1),
        "stderr": r.stderr[-2000:],
    }


def step_check_cost(env: dict[str, str], runs: int = 5) -> dict[str, Any]:
    if not Path("/usr/bin/time").exists():
        return {"ok": None, "why": "/usr/bin/time is not installed (apt install time)"}
    from bench.agent_cost import child_cost

    cmd = [sys.executable, "-m", "babysitter.cli.main", "check", "--json"]
    got = [child_cost(cmd, env) for _ in range(runs)]
    cpu = sorted(g[0] for g in got)
    return {
        "ok": True,
        "cpu_s_p50": round(cpu[len(cpu) // 2], 3),
        "cpu_s_max": round(cpu[-1], 3),
        "peak_rss_mb": round(max(g[1] for g in got), 1),
        "runs": runs,
    }


def step_live_agent(env: dict[str, str], work: Path, seconds: float) -> dict[str, Any]:
    import secrets
    import socket

    from babysitter.controller.api.auth import node_token
    from bench.agent_cost import cpu_s, rss_mb
    from bench.common import wait_ready

    secret = secrets.token_hex(32)
    files = {"cluster.secret": secret, "admin.token": secrets.token_hex(16)}
    files["node.token"] = node_token(secret.encode(), "gpucheck")
    for name, text in files.items():
        (work / name).write_text(text)
        (work / name).chmod(0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctl_env = dict(
        env,
        BABYSITTER_CONTROLLER__LISTEN=f"127.0.0.1:{port}",
        BABYSITTER_CONTROLLER__DATABASE_URL=f"sqlite:///{work / 'ctl.db'}",
        BABYSITTER_CONTROLLER__CLUSTER_SECRET_FILE=str(work / "cluster.secret"),
        BABYSITTER_CONTROLLER__ADMIN_TOKEN_FILE=str(work / "admin.token"),
        BABYSITTER_CONTROLLER__REMEDIATION="false",
    )
    agent_env = dict(
        env,
        BABYSITTER_AGENT__CONTROLLER_URL=f"http://127.0.0.1:{port}",
        BABYSITTER_AGENT__NODE_NAME="gpucheck",
        BABYSITTER_AGENT__TOKEN_FILE=str(work / "node.token"),
    )
    cmd = [sys.executable, "-m", "babysitter.cli.main"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(work / "ctl.log", "wb") as log:
            procs.append(
                subprocess.Popen([*cmd, "controller"], env=ctl_env, stdout=log, stderr=log)
            )
        wait_ready(f"http://127.0.0.1:{port}", 60, proc=procs[0], log=work / "ctl.log")
        with open(work / "agent.log", "wb") as log:
            agent = subprocess.Popen([*cmd, "agent"], env=agent_env, stdout=log, stderr=log)
        procs.append(agent)
        time.sleep(20)  # start-up is not the steady state
        c0, w0 = cpu_s(agent.pid), time.monotonic()
        time.sleep(seconds)
        if agent.poll() is not None:
            return {"ok": False, "why": f"agent exited: {(work / 'agent.log').read_text()[-500:]}"}
        c1, w1 = cpu_s(agent.pid), time.monotonic()
        rss, peak = rss_mb(agent.pid)
        on_gpu = {i: p for i, p in gpu_processes().items() if agent.pid in p}
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
    return {
        "ok": not on_gpu,
        "why": f"the agent is a compute process on GPUs {sorted(on_gpu)}" if on_gpu else "",
        "cpu_share_pct": round((c1 - c0) / (w1 - w0) * 100, 4),
        "rss_mb": round(rss, 1),
        "peak_rss_mb": round(peak, 1),
        "window_s": round(w1 - w0, 1),
    }


def run(args: argparse.Namespace, machine: dict[str, Any]) -> int:
    from bench.common import figure, missing, write_result

    gpus = int(machine["nvml"]["gpus"])
    steps: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as d:
        work = Path(d)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BABYSITTER_")}
        env.update(
            BABYSITTER_AGENT__SPOOL_PATH=str(work / "spool.db"),
            BABYSITTER_CHECKS__HOST__CHECK_SLURMD="false",  # a GPU machine need not run Slurm
            BABYSITTER_CHECKS__GPU__EXPECTED_COUNT=str(gpus),
        )
        plan = [
            ("checks", lambda: step_checks(env)),
            ("events", lambda: step_events(args.event_wait_s)),
            ("sdc_torch", lambda: step_sdc("torch", gpus, work)),
            ("sdc_cupy", lambda: step_sdc("cupy", gpus, work)),
            ("sdc_check", lambda: step_sdc_check(env)),
            ("validate", lambda: step_validate(env)),
            ("check_cost", lambda: step_check_cost(env)),
        ]
        if args.live_s > 0:
            plan.append(("live_agent", lambda: step_live_agent(env, work, args.live_s)))
        for name, fn in plan:
            t = time.monotonic()
            try:
                steps[name] = fn()
            except Exception as exc:  # a step that broke is a failed step, recorded
                steps[name] = {"ok": False, "why": f"{type(exc).__name__}: {exc}"[:1000]}
            steps[name]["step_s"] = round(time.monotonic() - t, 1)
            print(f"gpu-check: {name}: {_verdict(steps[name])}", file=sys.stderr)
    failed = [n for n, s in steps.items() if s.get("ok") is False]
    figures = [
        missing(f"gpu-check {name}", "step", s.get("why", ""))
        if s.get("ok") is None
        else figure(
            f"gpu-check {name}",
            1.0 if s["ok"] else 0.0,
            "passed",
            goal="1 (passed)",
            met=bool(s["ok"]),
            why=s.get("why", ""),
        )
        for name, s in steps.items()
    ]
    for name, key, unit in [
        ("check_cost", "cpu_s_p50", "s"),
        ("check_cost", "peak_rss_mb", "MB"),
        ("sdc_torch", "child_peak_rss_mb", "MB"),
        ("sdc_cupy", "child_peak_rss_mb", "MB"),
        ("live_agent", "cpu_share_pct", "% of one core"),
        ("live_agent", "rss_mb", "MB"),
    ]:
        if isinstance(steps.get(name, {}).get(key), float):
            figures.append(figure(f"gpu-check {name} {key}", steps[name][key], unit))
    path = write_result(
        "gpu_check", figures, {"machine_gpus": machine, "steps": steps}, results_dir=args.out
    )
    print(f"gpu-check: results in {path}; failed steps: {failed or 'none'}", file=sys.stderr)
    return EXIT_FAILED if failed else 0


def _verdict(s: dict[str, Any]) -> str:
    return {True: "passed", False: "FAILED", None: "not run"}[s.get("ok")] + (
        f" ({s['why']})" if s.get("why") else ""
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preflight", action="store_true", help="only say whether a GPU is here")
    ap.add_argument("--live-s", type=float, default=300.0, help="live agent window (0: skip)")
    ap.add_argument("--event-wait-s", type=float, default=10.0)
    ap.add_argument("--out", type=Path, default=None, help="results dir (bench/results)")
    args = ap.parse_args(argv)
    try:
        machine = preflight()
    except NoGpu as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    if args.preflight:
        gpus = machine["nvidia_smi"]
        print(f"gpu-check: {len(gpus)} GPU(s): {', '.join(g['name'] for g in gpus)}")
        return 0
    return run(args, machine)


if __name__ == "__main__":
    sys.exit(main())
