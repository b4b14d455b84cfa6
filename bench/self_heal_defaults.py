"""bench/self_heal.py at the shipped intervals (agent report 30 s, checks on their own tiers,
controller loop 1 s; the reboot stays the devcluster's simulated one): the loop time the ETTR
simulator's self-healing arm uses. Run: python -m bench.self_heal_defaults [injections]"""

from __future__ import annotations

import sys

from bench import self_heal

INJECTIONS = 6

if __name__ == "__main__":
    raise SystemExit(self_heal.main(["--defaults", *(sys.argv[1:] or [str(INJECTIONS)])]))
