"""`dcgmi diag -r LEVEL -j`: run it bounded, parse its JSON, judge it. Anything this module cannot
read as a verdict (no dcgmi output, not JSON, a shape it does not know, a status it does not
know, nothing that ran) is a failure that says so, never a pass; where DCGM's words name why
(not installed, nv-hostengine not running, too old) the failure names it (causes.py).

The shapes, from NVIDIA/DCGM at tags v2.4.7, v3.3.9 and v4.6.0 (dcgmi/Diag.cpp
HelperJsonBuildOutput / HelperDisplayFailureMessage, nvvs/include/NvvsJsonStrings.h,
testing/python3/dcgm_diag_schema.json), checked against the samples in tests/data/world/dcgm/:

- The top-level object is NVVS_NAME: "DCGM GPU Diagnostic" in DCGM 2.x and 3.x, "DCGM
  Diagnostic" from 4.0. Inside it {"test_categories": [{"category": str, "tests": [{"name":
  str, "results": [{"status": str, "warnings": [{"warning": str, "error_id": int, ...}],
  "info": ...}]}]}]}; a diag that could not run at all prints {NAME: {"version": str,
  "runtime_error": str}} (and exits non-zero).
- 2.x/3.x: a GPU's result names it by "gpu_id" (a string); a Deployment test carries one
  result whose messages sit under "warnings" inside each warning; the DCGM version and
  "Driver Version Detected" are top-level keys beside NAME. 2.x names the first software test
  "Blacklist", 3.x "Denylist".
- 4.x: a result names its entity ("entity_group": "GPU", "entity_id": int); a test carries a
  "test_summary": {"status": ...}; a test that did not run is printed as its "name" alone
  (results and summary of DCGM_DIAG_RESULT_NOT_RUN are left out): not run; top-level
  "metadata" {"version", "Driver Version Detected"} and "entity_groups".
- The status words dcgmi prints (HelperDisplayDiagResult): "Pass", "Skip", "Fail" in every
  version (2.x/3.x print a Warn and a not-run software test as "Fail"; 4.x prints Warn as
  "Fail" in JSON), "Not Run" and "Warn" in 4.x's other outputs; nvvs's own JSON prints "PASS",
  "WARN", "SKIP", "FAIL". Case is ignored; any other word is unknown.
- 2.x's `dcgmi diag` without nv-hostengine prints "Error: unable to establish a connection to
  the specified host: localhost" before the JSON of the diag it then runs embedded: text
  before the JSON object is skipped when the object follows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from babysitter.checks.dcgm import causes

LEVEL_ENV = "BABYSITTER_DCGM_LEVEL"  # how the controller's validation job passes the level
NAME = "DCGM Diagnostic"  # DCGM 4.x
NAMES = (NAME, "DCGM GPU Diagnostic")  # 4.x, then 2.x/3.x (NvvsJsonStrings.h NVVS_NAME)
MAX_OUTPUT = 8 * 1024 * 1024  # a diag's JSON is a few kB; more is not read
PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
# DCGM's words (Diag.cpp HelperDisplayDiagResult; nvvs Output.cpp) -> ours; others are unknown
STATUSES = {"pass": PASS, "warn": WARN, "fail": FAIL, "skip": SKIP, "not run": SKIP}
RANK = {SKIP: 0, PASS: 1, WARN: 2, FAIL: 3}


@dataclass(frozen=True)
class TestResult:
    name: str
    category: str
    status: str  # pass | warn | fail | skip
    messages: list[str] = field(default_factory=list)  # "GPU 0: ..." (at most 3)


@dataclass(frozen=True)
class DiagResult:
    level: int
    ok: bool
    tests: list[TestResult]
    failures: list[str]  # why it did not pass (a failed test, or why there is no verdict)
    version: str = ""  # the DCGM version its JSON names ("" where it names none)
    shape: str = ""  # "2.x/3.x" or "4.x": which top-level object it printed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Unreadable(ValueError):
    """The output is not a diag result babysitter knows: no verdict (a failure)."""


def find_dcgmi(configured: str = "dcgmi") -> str | None:
    """The dcgmi binary on this node (a path, or a name looked up on PATH); None: no DCGM."""
    return shutil.which(configured)


def command(dcgmi: str, level: int) -> list[str]:
    return [dcgmi, "diag", "-r", str(level), "-j"]


def run(argv: list[str], timeout_s: float) -> tuple[int | None, str]:
    """(exit status, at most MAX_OUTPUT of its stdout); exit None: killed at its timeout (the
    whole process group: dcgmi's children too). Output goes through a file: bounded memory,
    no pipe to fill."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            code = None
        out.seek(0)
        return code, out.read(MAX_OUTPUT).decode("utf-8", "replace")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def parse(text: str) -> dict[str, Any]:
    """dcgmi's JSON object: the whole output, or the object that starts a line after text
    dcgmi printed first (2.x's connection error before an embedded run); raises Unreadable."""
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
        for m in re.finditer(r"^[ \t]*\{", text, re.MULTILINE):
            try:
                doc, _ = json.JSONDecoder().raw_decode(text, m.end() - 1)
                break
            except ValueError:
                continue
        if doc is None:
            raise Unreadable("dcgmi printed no JSON") from None
    if not isinstance(doc, dict):
        raise Unreadable("dcgmi JSON is not an object")
    return doc


def document(doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(the top-level name, the diag object) of dcgmi's JSON (raises Unreadable)."""
    for name in NAMES:
        if isinstance(doc.get(name), dict):
            return name, doc[name]
    raise Unreadable(f'dcgmi JSON has no "{NAMES[0]}" (4.x) or "{NAMES[1]}" (2.x/3.x) object')


def status_of(word: Any) -> str:
    """Our status for DCGM's word (raises Unreadable on a word DCGM does not print)."""
    s = STATUSES.get(str(word).strip().lower()) if isinstance(word, str) else None
    if s is None:
        raise Unreadable(f"unknown diag status {word!r}")
    return s


def _entity(r: dict[str, Any]) -> str:
    if "entity_id" in r:  # 4.x
        return f"{r.get('entity_group', 'GPU')} {r['entity_id']}"
    if "gpu_id" in r or "gpu_ids" in r:  # 3.x, nvvs
        return f"GPU {r.get('gpu_id', r.get('gpu_ids'))}"
    return ""


def _messages(r: dict[str, Any]) -> list[str]:
    out = []
    for w in r.get("warnings") or []:
        # "warning" (3.x GPU results, 4.x); 3.x software tests nest "warnings"
        text = w.get("warning", w.get("warnings", "")) if isinstance(w, dict) else w
        if text:
            out.append(str(text)[:300])
    return out


def test_result(category: str, t: Any) -> TestResult:
    """One test: 4.x's test_summary when present, else the worst of its results."""
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise Unreadable(f"a test of category {category!r} has no name")
    results = t.get("results", [])
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        raise Unreadable(f"test {t['name']!r} has results of an unknown shape")
    statuses = [status_of(r.get("status")) for r in results]
    summary = t.get("test_summary")
    if isinstance(summary, dict) and "status" in summary:
        statuses.append(status_of(summary["status"]))
    if not statuses and set(t) == {"name"}:
        statuses = [SKIP]  # 4.x prints a test that did not run by its name alone
    if not statuses:
        raise Unreadable(f"test {t['name']!r} has no status")
    status = max(statuses, key=RANK.__getitem__)
    messages = []
    for r in results:
        where = _entity(r)
        messages += [f"{where}: {m}" if where else m for m in _messages(r)]
    if isinstance(summary, dict) and not messages:
        messages = _messages(summary)
    return TestResult(t["name"], category, status, messages[:3])


def tests(diag: dict[str, Any]) -> list[TestResult]:
    cats = diag.get("test_categories")
    if not isinstance(cats, list) or not cats:
        raise Unreadable("dcgmi JSON has no test categories")
    out = []
    for c in cats:
        if not isinstance(c, dict) or not isinstance(c.get("tests"), list):
            raise Unreadable("a test category of an unknown shape")
        category = str(c.get("category", ""))
        out += [test_result(category, t) for t in c["tests"]]
    return out


def version(doc: dict[str, Any], diag: dict[str, Any]) -> str:
    """The DCGM version the JSON names: 4.x's metadata, 2.x/3.x's top-level "version", or the
    diag object's (a runtime_error)."""
    meta = doc.get("metadata")
    found = meta.get("version") if isinstance(meta, dict) else None
    return str(found or doc.get("version") or diag.get("version") or "")


def _no_verdict(level: int, why: str, ver: str = "", shape: str = "") -> DiagResult:
    return DiagResult(level, False, [], [f"dcgmi diag -r {level}: {why}"], ver, shape)


def judge(level: int, text: str, code: int | None, timeout_s: float) -> DiagResult:
    """The verdict of one `dcgmi diag` run: ok only when its JSON is known, some test ran and
    none failed (Warn passes, and is kept with the test)."""
    if code is None:
        return _no_verdict(level, f"no result within {timeout_s:g} s (killed)")
    try:
        doc = parse(text)
    except Unreadable as exc:
        # no JSON at all: dcgmi's own words may say why (nv-hostengine down, ...)
        return _no_verdict(level, causes.from_text(text) or f"{exc} (exit {code})")
    try:
        name, diag = document(doc)
    except Unreadable as exc:
        return _no_verdict(level, f"{exc} (exit {code})")
    ver, shape = version(doc, diag), "4.x" if name == NAME else "2.x/3.x"
    if too_old := causes.from_version(ver):
        return _no_verdict(level, too_old, ver, shape)
    if diag.get("runtime_error"):
        why = str(diag["runtime_error"])
        named = causes.from_text(why)
        return _no_verdict(level, f"{named or 'did not run'}: {why.strip()[:300]}", ver, shape)
    try:
        found = tests(diag)
    except Unreadable as exc:
        return _no_verdict(level, f"{exc} (exit {code})", ver, shape)
    failed = [t for t in found if t.status == FAIL]
    failures = [
        f"dcgmi diag -r {level}: {t.name} failed" + (f" ({t.messages[0]})" if t.messages else "")
        for t in failed
    ]
    if not failed and not any(t.status in (PASS, WARN) for t in found):
        failures = [f"dcgmi diag -r {level}: no test ran (all skipped)"]
    elif not failed and code != 0:
        failures = [f"dcgmi diag -r {level}: exit {code} with no failed test named"]
    return DiagResult(level, not failures, found, failures, ver, shape)


def diagnose(dcgmi: str, level: int, timeout_s: float) -> DiagResult:
    """Run `dcgmi diag -r LEVEL -j` and judge it."""
    try:
        code, text = run(command(dcgmi, level), timeout_s)
    except OSError as exc:
        return _no_verdict(level, causes.from_oserror(exc))
    return judge(level, text, code, timeout_s)


def summary(res: DiagResult) -> str:
    """One line per run, for the action's outcome: each test and its status."""
    tests = ", ".join(f"{t.name} {t.status}" for t in res.tests)
    return f"dcgmi diag -r {res.level}: " + (tests or "; ".join(res.failures))
