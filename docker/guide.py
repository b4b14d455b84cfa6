"""docs/deploy.md as scripts: the fenced blocks marked ```` ```sh deploy:<step> ```` become one
bash script per step, in the order the guide gives them. The docker test cluster is built and
started by running these scripts (docker/Dockerfile, docker/entrypoint.sh), so the guide's
commands are what the tests run and cannot rot unnoticed.

    python3 docker/guide.py write DIR     # DIR/<step>.sh for every step
    python3 docker/guide.py list          # the steps and their line numbers in the guide

Steps: `site` (the site values; the test cluster sets its own instead), `install` and `plugin`
(every host: the image build), `db` (the database host), `controller`, `node`, `enforce` (after
the dry-run week; the test cluster skips the week), `verify-controller`, `verify-node`,
`backup`. Blocks without a `deploy:` mark (systemctl, ssh, clush, …) are for a real cluster
only; docker/entrypoint.sh does their part (starting a unit, copying a file between hosts).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
MARK = re.compile(r"^```sh deploy:([a-z-]+)[ \t]*$")
HEADER = (
    "#!/bin/bash\n"
    "# generated from docs/deploy.md (deploy:{step}) by docker/guide.py: edit the guide, not this\n"
    "set -euo pipefail\n"
)


class GuideError(ValueError):
    pass


def blocks(text: str) -> list[tuple[str, int, str]]:
    """(step, line number, body) of every marked block, in the guide's order."""
    out: list[tuple[str, int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if m:
            start = i + 1
            end = next((j for j in range(start, len(lines)) if lines[j] == "```"), None)
            if end is None:
                raise GuideError(f"docs/deploy.md:{i + 1}: deploy:{m.group(1)} block never ends")
            body = "\n".join(lines[start:end]).strip("\n")
            if not body.strip():
                raise GuideError(f"docs/deploy.md:{i + 1}: deploy:{m.group(1)} block is empty")
            out.append((m.group(1), i + 1, body))
            i = end
        i += 1
    return out


def steps(text: str | None = None) -> dict[str, str]:
    """Each step's script: its blocks joined in order, after a strict-mode header."""
    scripts: dict[str, list[str]] = {}
    for step, line, body in blocks(GUIDE.read_text() if text is None else text):
        scripts.setdefault(step, []).append(f"# docs/deploy.md:{line}\n{body}\n")
    return {s: HEADER.format(step=s) + "\n".join(parts) for s, parts in scripts.items()}


def variables(script: str) -> set[str]:
    """Upper-case shell variables a script reads (the site values it needs)."""
    body = "\n".join(ln for ln in script.splitlines() if not ln.lstrip().startswith("#"))
    used = set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", body))
    assigned = set(re.findall(r"(?m)(?:^|[\s;(])([A-Z][A-Z0-9_]*)=", body))
    return used - assigned


def write(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for step, script in steps().items():
        p = out / f"{step}.sh"
        p.write_text(script)
        p.chmod(0o755)
        paths.append(p)
    return paths


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "write":
        for p in write(Path(argv[2])):
            print(p)
        return 0
    if len(argv) == 2 and argv[1] == "list":
        for step, line, _ in blocks(GUIDE.read_text()):
            print(f"{step}\tdocs/deploy.md:{line}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
