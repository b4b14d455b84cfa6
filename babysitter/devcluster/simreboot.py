"""The sim's reboot hook (`devcluster up --reboot-hook`, run by devcluster/reboot.py as
`python -m babysitter.devcluster.simreboot DIR NODE`): the power cycle of a simulated node is
done by the SimCluster that owns its agent and fake GPUs, so this asks it through a request file
in DIR and waits until the SimCluster has done it (removed the file).

`python -m babysitter.devcluster.simreboot reset DIR NODE INDEX` is a simulated node's GPU
reset command (`[agent] gpu_reset_command`, run by the agent): the SimCluster heals that fake
GPU the way `nvidia-smi --gpu-reset` would."""

from __future__ import annotations

import sys
import time
from pathlib import Path

WAIT_S = 90.0


def request(directory: Path, node: str, wait_s: float = WAIT_S, suffix: str = ".req") -> bool:
    directory.mkdir(parents=True, exist_ok=True)
    req = directory / f"{node}{suffix}"
    tmp = directory / f".{node}{suffix}.tmp"
    tmp.write_text(node)
    tmp.rename(req)  # atomic: the watcher never reads half a request
    deadline = time.monotonic() + wait_s
    while req.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def main(argv: list[str]) -> int:
    if argv[:1] == ["reset"]:
        directory, node, index = Path(argv[1]), argv[2], int(argv[3])
        return 0 if request(directory, node, suffix=f".gpu{index}.reset") else 1
    return 0 if request(Path(argv[0]), argv[1]) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
