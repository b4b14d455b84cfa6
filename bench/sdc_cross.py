"""Cross-device SDC detection, measured with real separate devices: one OS process per device
(CPU backend here), each with its own inputs, reference and result buffers, running the SDC
check's own per-device step (`runner._run_device`: matmul, ABFT checksums, digest). A bit flip
is injected into one device's C inside that device's process; the parent only receives each
device's verdict and digest and votes with the check's own `runner._vote`, as `run_sdc` does.
Nothing is compared with itself: a flip is caught only if the other device's independently
computed digest differs (or the flipped device's own checksums fail).

Reported: the share of flips detected with two devices (a mismatch; which device is bad
cannot be told from two) and with three (the flipped device named alone), per group of bits;
false alarms in rounds with no flip (the devices must agree bit for bit); and the time of a
round from the flip to the verdict."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import random
import time
from multiprocessing.connection import Connection
from typing import Any

from babysitter.checks.sdc import abft, runner
from babysitter.checks.sdc.backends import Device, numpy_devices
from babysitter.checks.sdc.runner import DeviceResult
from bench.common import summary

DEVICES = 3
GROUPS = {"sign": [31], "exponent": list(range(23, 31)), "mantissa": list(range(23))}


def _device(conn: Connection, index: int, n: int, dtype: str, seed: int) -> None:
    """One device: its own copy of the inputs and reference, one round per request."""
    a, b = runner.inputs(n, dtype, seed)
    ref = abft.prepare(a, b, dtype)
    _, [cpu] = numpy_devices(1)
    dev = Device(f"cpu{index}", f"process:{index}", cpu.model, cpu.run)
    conn.send("ready")
    while (flip := conn.recv()) != "stop":
        result, _ = runner._run_device(dev, a, b, ref, n, flip)
        conn.send(result)


def _flagged(results: list[DeviceResult]) -> list[bool]:
    """The check's verdict per device: its checksums failed or it disagrees with the vote."""
    mine = [dataclasses.replace(r) for r in results]  # _vote sets matches_peers in place
    runner._vote(mine)
    return [not r.abft_ok or not r.matches_peers for r in mine]


def measure(n: int = 256, per_bit: int = 20, clean: int = 100, seed: int = 7) -> dict[str, Any]:
    ctx = mp.get_context("spawn")  # fresh interpreters: nothing shared with this process
    pipes, procs = [], []
    for i in range(DEVICES):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_device, args=(child, i, n, "float32", 11), daemon=True)
        p.start()
        pipes.append(parent)
        procs.append(p)
    try:
        for c in pipes:
            if not c.poll(120) or c.recv() != "ready":
                raise RuntimeError("an SDC device process did not start")
        rng = random.Random(seed)
        trials: list[tuple[int, int, int, int] | None] = [None] * clean
        for bit in range(32):
            for _ in range(per_bit):
                # the flip lands on device 0 or 1, so the two-device vote always includes it
                trials.append((rng.randrange(2), rng.randrange(n), rng.randrange(n), bit))
        rng.shuffle(trials)
        per_bit_stats = {b: {"n": 0, "pair": 0, "named": 0, "abft": 0} for b in range(32)}
        false_pair = false_triple = 0
        rounds: list[float] = []
        for trial in trials:
            t = time.perf_counter()
            for i, c in enumerate(pipes):
                c.send(trial[1:] if trial and trial[0] == i else None)
            results = [c.recv() for c in pipes]
            pair, triple = _flagged(results[:2]), _flagged(results)
            rounds.append(time.perf_counter() - t)
            if trial is None:
                false_pair += any(pair)
                false_triple += any(triple)
                continue
            dev, bit = trial[0], trial[3]
            s = per_bit_stats[bit]
            s["n"] += 1
            s["pair"] += pair[dev]
            s["named"] += triple == [i == dev for i in range(DEVICES)]
            s["abft"] += not results[dev].abft_ok
        for c in pipes:
            c.send("stop")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    groups: dict[str, dict[str, float]] = {}
    for name, bits in {**GROUPS, "all": list(range(32))}.items():
        total = sum(per_bit_stats[b]["n"] for b in bits)
        groups[name] = {
            "injections": total,
            "two_devices_detected": sum(per_bit_stats[b]["pair"] for b in bits) / total,
            "three_devices_named": sum(per_bit_stats[b]["named"] for b in bits) / total,
            "abft_alone": sum(per_bit_stats[b]["abft"] for b in bits) / total,
        }
    return {
        "n": n,
        "devices": DEVICES,
        "clean_rounds": clean,
        "false_alarms_two_devices": false_pair,
        "false_alarms_three_devices": false_triple,
        "groups": groups,
        "round_s": summary(rounds),
    }
