"""The sim's reboot hook (`devcluster up --reboot-hook`, run by devcluster/reboot.py as
`python -m babysitter.devcluster.simreboot DIR NODE`): the power cycle of a simulated node is
done by the SimCluster that owns its agent and fake GPUs, so this asks it through a request file
in DIR and waits until the SimCluster has done it (removed the file)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

WAIT_S = 90.0


def request(directory: Path, node: str, wait_s: float = WAIT_S) -> bool:
    directory.mkdir(parents=True, exist_ok=True)
    req = directory / f"{node}.req"
    tmp = directory / f".{node}.tmp"
    tmp.write_text(node)
    tmp.rename(req)  # atomic: the watcher never reads half a request
    deadline = time.monotonic() + wait_s
    while req.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


if __name__ == "__main__":
    raise SystemExit(0 if request(Path(sys.argv[1]), sys.argv[2]) else 1)
