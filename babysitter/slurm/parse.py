"""Turn Slurm's JSON (22.05's v0.0.38 up to 26.05's v0.0.45) and `scontrol show -o` text into
SlurmNode / SlurmJob. The shapes differ a lot between versions; every difference is handled
here so the rest of babysitter sees one model.

Differences handled (see shared notes/slurm-versions.md):
- node state: 22.05 lowercase `state` + `state_flags` list; 24.11+ one upper-case list
- job state: a string on 22.05, a list on 24.11+ (["PENDING", "COMPLETING"] after requeue)
- numbers: plain ints on 22.05, `{"set", "infinite", "number"}` objects later
- `job_resources.allocated_nodes[].nodename` vs `nodes.allocation[].name`; hostlist strings
- `sinfo --json` `.nodes[]` (22.05) vs grouped `.sinfo[]` (24.11+)
"""

from __future__ import annotations

import re
from typing import Any

from babysitter.slurm.client import SlurmJob, SlurmNode
from babysitter.slurm.hostlist import expand

_BASE_NODE_STATES = {
    "IDLE",
    "MIXED",
    "ALLOCATED",
    "DOWN",
    "ERROR",
    "FUTURE",
    "UNKNOWN",
    "COMPLETING",
}


def number(v: Any, default: int = 0) -> int:
    """Slurm number: int, numeric string, or {"set": bool, "infinite": bool, "number": n}."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return default
    if isinstance(v, dict):
        if v.get("infinite") or not v.get("set", True):
            return default
        return number(v.get("number"), default)
    return default


def text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, dict):  # 24.11+ reason {"description": ...}
        return text(v.get("description", ""))
    if isinstance(v, list):
        return ",".join(text(x) for x in v)
    return str(v)


def node_state(raw: dict[str, Any]) -> tuple[str, frozenset[str]]:
    st = raw.get("state")
    words: list[str] = []
    if isinstance(st, list):
        words = [str(w).upper() for w in st]
    elif isinstance(st, str):
        words = [w for w in re.split(r"[+,\s]+", st.upper()) if w]
    flags_raw = raw.get("state_flags") or []
    if isinstance(flags_raw, list):
        words += [str(w).upper() for w in flags_raw]
    base = next((w for w in words if w in _BASE_NODE_STATES), words[0] if words else "UNKNOWN")
    base = base.rstrip("*")
    flags = frozenset(w for w in words if w != base)
    return base, flags


def _boot_time(v: Any) -> str:
    """boot_time: epoch seconds (22.05) or {"set", "number"} (newer); "" when unknown."""
    if isinstance(v, dict):
        v = v.get("number") if v.get("set", True) else None
    return str(int(v)) if isinstance(v, int | float) and v > 0 else ""


def node_from_json(raw: dict[str, Any]) -> SlurmNode:
    base, flags = node_state(raw)
    parts = raw.get("partitions") or []
    if isinstance(parts, str):
        parts = [p for p in parts.split(",") if p]
    reason_user = raw.get("reason_set_by_user")
    return SlurmNode(
        name=str(raw.get("name") or raw.get("hostname") or ""),
        state=base,
        flags=flags,
        reason=text(raw.get("reason")),
        reason_user=text(reason_user),
        partitions=tuple(str(p) for p in parts),
        gres=text(raw.get("gres")),
        boot_time=_boot_time(raw.get("boot_time")),
    )


def nodes_from_json(doc: dict[str, Any]) -> list[SlurmNode]:
    """`sinfo --json` (22.05), `scontrol show node --json` / REST /nodes (any version)."""
    if isinstance(doc.get("nodes"), list):
        try:
            return [node_from_json(n) for n in doc["nodes"] if isinstance(n, dict)]
        except (TypeError, AttributeError, KeyError) as exc:
            raise ValueError(f"malformed node record in Slurm JSON: {exc}") from None
    raise ValueError("no 'nodes' list in Slurm JSON")


def _job_nodes(raw: dict[str, Any]) -> tuple[str, ...]:
    nodes = raw.get("nodes")
    if isinstance(nodes, str) and nodes:
        return tuple(expand(nodes))
    res = raw.get("job_resources") or {}
    if isinstance(res, dict):
        alloc = res.get("allocated_nodes")
        if isinstance(alloc, list):
            return tuple(str(a.get("nodename")) for a in alloc if isinstance(a, dict))
        rn = res.get("nodes")
        if isinstance(rn, dict):
            if isinstance(rn.get("list"), str):
                return tuple(expand(rn["list"]))
            if isinstance(rn.get("allocation"), list):
                return tuple(str(a.get("name")) for a in rn["allocation"] if isinstance(a, dict))
    return ()


def job_from_json(raw: dict[str, Any]) -> SlurmJob:
    st = raw.get("job_state")
    if isinstance(st, list):
        states = tuple(str(s).upper() for s in st)
    elif isinstance(st, str):
        states = tuple(w for w in re.split(r"[+,\s]+", st.upper()) if w)
    else:
        states = ()
    excl = raw.get("excluded_nodes")
    excluded = tuple(expand(excl)) if isinstance(excl, str) else tuple(excl or ())
    req = raw.get("required_nodes")
    required = tuple(expand(req)) if isinstance(req, str) and req else ()
    return SlurmJob(
        job_id=number(raw.get("job_id")),
        name=text(raw.get("name")),
        states=states,
        state_reason=text(raw.get("state_reason")),
        nodes=_job_nodes(raw),
        batch_host=text(raw.get("batch_host")),
        requeue=bool(raw.get("requeue", True)),
        restart_count=number(raw.get("restart_cnt")),
        admin_comment=text(raw.get("admin_comment")),
        comment=text(raw.get("comment")),
        excluded_nodes=excluded,
        user=text(raw.get("user_name")),
        partition=text(raw.get("partition")),
        work_dir=text(raw.get("current_working_directory")),
        stdout=text(raw.get("standard_output")),
        stderr=text(raw.get("standard_error")),
        # --nodelist: a requeue that excludes one of these leaves the job nowhere to run
        extra={"required_nodes": ",".join(required)} if required else {},
    )


def jobs_from_json(doc: dict[str, Any]) -> list[SlurmJob]:
    if isinstance(doc.get("jobs"), list):
        try:
            return [job_from_json(j) for j in doc["jobs"] if isinstance(j, dict)]
        except (TypeError, AttributeError, KeyError) as exc:
            raise ValueError(f"malformed job record in Slurm JSON: {exc}") from None
    raise ValueError("no 'jobs' list in Slurm JSON")


def errors_of(doc: dict[str, Any]) -> list[str]:
    """Slurm JSON `.errors` (REST answers 200 with errors, e.g. 'Disabled key')."""
    out = []
    for e in doc.get("errors") or []:
        if isinstance(e, dict):
            msg = e.get("error") or e.get("description") or ""
            num = e.get("error_number") or e.get("errno")
            out.append(f"{msg} ({num})" if num else str(msg))
        else:
            out.append(str(e))
    return [m for m in out if m]


# ---- `scontrol show node|job -o` (one record per line of Key=Value pairs)
_KV = re.compile(r"(\S+?)=")


def parse_oneliner(line: str) -> dict[str, str]:
    """Key=Value pairs where values may contain spaces (e.g. Reason=babysitter: x [root@t])."""
    out: dict[str, str] = {}
    matches = [m for m in re.finditer(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_/:]*)=", line)]
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def node_from_scontrol(line: str) -> SlurmNode:
    kv = parse_oneliner(line)
    words = [w for w in re.split(r"[+]", kv.get("State", "UNKNOWN").upper()) if w]
    base = words[0].rstrip("*") if words else "UNKNOWN"
    flags = set(words[1:])
    if kv.get("State", "").endswith("*"):
        flags.add("NOT_RESPONDING")
    reason = kv.get("Reason", "")
    user = ""
    m = re.match(r"^(.*?)\s*\[([^@\]]+)@[^\]]*\]$", reason)
    if m:
        reason, user = m.group(1), m.group(2)
    if reason == "(null)":
        reason = ""
    parts = kv.get("Partitions", "")
    return SlurmNode(
        name=kv.get("NodeName", ""),
        state=base,
        flags=frozenset(flags),
        reason=reason,
        reason_user=user,
        partitions=tuple(p for p in parts.split(",") if p and p != "(null)"),
        gres=kv.get("Gres", ""),
        boot_time=kv.get("BootTime", ""),
    )


def job_from_scontrol(line: str) -> SlurmJob:
    kv = parse_oneliner(line)

    def val(key: str) -> str:
        v = kv.get(key, "")
        return "" if v == "(null)" else v

    return SlurmJob(
        job_id=number(val("JobId")),
        name=val("JobName"),
        states=tuple(w for w in val("JobState").split("+") if w),
        state_reason=val("Reason"),
        nodes=tuple(expand(val("NodeList"))),
        batch_host=val("BatchHost"),
        requeue=val("Requeue") != "0",
        restart_count=number(val("Restarts")),
        admin_comment=val("AdminComment"),
        comment=val("Comment"),
        excluded_nodes=tuple(expand(val("ExcNodeList"))),
        user=val("UserId").split("(")[0],
        partition=val("Partition"),
        work_dir=val("WorkDir"),
        stdout=val("StdOut"),
        stderr=val("StdErr"),
        extra=(
            {"required_nodes": ",".join(expand(val("ReqNodeList")))} if val("ReqNodeList") else {}
        ),
    )


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) from `slurm-wlm 22.05.8`, `slurm 24.11.5`, ..."""
    m = re.search(r"(\d+)\.(\d+)(?:\.\d+)?", text)
    if not m:
        raise ValueError(f"cannot read a Slurm version from {text!r}")
    return int(m.group(1)), int(m.group(2))
