"""Configuration: TOML file + `BABYSITTER_<SECTION>__<KEY>` environment overrides, validated by
msgspec. An unknown key or a bad value is a `ConfigError` naming the key.

msgspec, not pydantic: `babysitter check` runs as a Slurm HealthCheckProgram on every node every
few minutes, and importing pydantic and building these models cost more CPU than NHC's whole
run (pydantic stays where FastAPI needs it: the controller's API). Rules: names are
case-insensitive, `__` descends into a section, a list/dict/section value is JSON, anything else
a string converted to the key's type, the environment wins over the file key by key, and names
that are no setting are ignored. A value check that needs code is a `__post_init__` raising
`InvalidKey("<key>", "<why>")` (babysitter/settings.py), so the error still names the key; a
refused config is explained by babysitter/config_errors.py from the models' types.

Each section is its own model; a check's `[checks.<name>]` model lives in its own folder
(babysitter/checks/<name>/settings.py, on the base in babysitter/settings.py) and is assembled
here into `ChecksConfig`. Add keys to the model of the part you build, with a default and a
one-line description (docs/config.md, the configuration reference, is generated from these
models).
"""

import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, field

from babysitter.checks.fabric.settings import FabricCheckConfig
from babysitter.checks.gpu.settings import GpuCheckConfig
from babysitter.checks.host.settings import HostCheckConfig
from babysitter.checks.infiniband.settings import InfinibandCheckConfig
from babysitter.checks.nccl.settings import NcclCheckConfig
from babysitter.checks.sdc.settings import SdcCheckConfig
from babysitter.checks.xid.settings import XidCheckConfig
from babysitter.errors import ConfigError
from babysitter.finding import Severity
from babysitter.hardware.profiles import PROFILES
from babysitter.settings import InvalidKey, Section, plain, section_fields, section_model

DEFAULT_CONFIG_PATH = Path("/etc/babysitter/babysitter.toml")
ENV_CONFIG = "BABYSITTER_CONFIG"
ENV_PREFIX = "BABYSITTER_"
ENV_NESTED = "__"

# Upper bounds of the caps on what babysitter takes out of service (a fraction's is 1, its
# type's): no file can set a cap above them, at start or on reload. docs/deploy.md#caps says
# why each; babysitter/reload.py CAPS lists the caps.
MAX_DRAINS_PER_HOUR = 1000  # ~10% of today's largest Slurm clusters in one hour
MAX_MIN_DRAINABLE = 16  # a floor above it, not the fraction, caps most partitions
MAX_SCOPE_COUNT = 10_000  # a blast-radius count: about the largest Slurm cluster
MAX_CONCURRENT_REBOOTS = 64  # a reboot storm beyond it is not self-healing any more


def _short_hostname() -> str:
    return os.uname().nodename.split(".")[0]  # gethostname(), without socket's import


class AgentConfig(Section):
    controller_url: Annotated[str, Meta(description="controller base URL")] = (
        "http://127.0.0.1:8090"
    )
    node_name: Annotated[str, Meta(description="Slurm node name")] = field(
        default_factory=_short_hostname
    )
    sysfs_root: Annotated[Path, Meta(description="root under which sys/class/... is read")] = Path(
        "/"
    )
    kmsg_path: Annotated[Path, Meta(description="kernel log to scan for NVRM XIDs")] = Path(
        "/dev/kmsg"
    )
    spool_path: Annotated[Path, Meta(description="durable report spool (SQLite)")] = Path(
        "/var/lib/babysitter/spool.db"
    )
    spool_max_reports: Annotated[int, Meta(ge=10, description="spool bound; oldest dropped")] = (
        10_000
    )
    interval_s: Annotated[
        float, Meta(gt=0, description="report cycle; checks keep own intervals")
    ] = 30.0
    fast_interval_s: Annotated[
        float,
        Meta(
            gt=0, description="fast-tier period: cheap reads of job-killing faults (GPU lost, DBE)"
        ),
    ] = 1.0
    boot_id_path: Annotated[
        Path, Meta(description="identifies this boot: event findings are kept until it changes")
    ] = Path("/proc/sys/kernel/random/boot_id")
    token_file: Annotated[Path, Meta(description="this node's API token")] = Path(
        "/etc/babysitter/node.token"
    )
    request_timeout_s: Annotated[
        float, Meta(gt=0, description="HTTP timeout for report shipping")
    ] = 5.0
    metrics_listen: Annotated[
        str | None,
        Meta(description="host:port for the agent's Prometheus metrics (off when unset)"),
    ] = None
    enabled_checks: Annotated[
        list[str] | None,
        Meta(
            description="checks to run, by name or prefix (default: every non-invasive check that "
            "is supported; an invasive one, sdc.matmul or nccl.perf, runs only when named here)"
        ),
    ] = None
    ca_file: Annotated[
        Path | None,
        Meta(description="CA bundle to verify an https controller with (agent and CLI)"),
    ] = None
    syslog_socket: Annotated[
        str,
        Meta(
            description="syslog socket (journald reads it) that `babysitter check --slurm-drain` "
            "logs its drains, resumes and failures to: Slurm discards the HealthCheckProgram's "
            "stderr (empty: stderr only)"
        ),
    ] = "/dev/log"
    hardware_profile: Annotated[
        str | None,
        Meta(
            description="what the node is built as: " + ", ".join(PROFILES) + " (default: detected "
            "from the GPU model; a configured profile also requires its GPU count and IB fabric)"
        ),
    ] = None

    gpu_reset_command: Annotated[
        list[str],
        Meta(
            min_length=1,
            description="argv the agent runs when the controller orders a GPU reset (the "
            "`reset_gpu` rung); {bus_id}, {uuid} and {index} name the GPU",
        ),
    ] = field(default_factory=lambda: ["nvidia-smi", "--gpu-reset", "-i", "{bus_id}"])
    gpu_reset_timeout_s: Annotated[
        float, Meta(gt=0, description="a reset command still running after this has failed")
    ] = 120.0
    gpu_reset_models: Annotated[
        str,
        Meta(
            description="regex of the GPU models (NVML name) whose single-GPU reset is "
            "supported; the agent refuses a reset of any other"
        ),
    ] = r"(?i)\b(A100|A800|A30|H100|H800|H200|H20|GH200|B100|B200|B300|GB200|GB300)\b"

    def __post_init__(self) -> None:
        import re  # here: `babysitter check` (Slurm's HealthCheckProgram) imports no more

        try:
            re.compile(self.gpu_reset_models)
        except re.error as exc:
            raise InvalidKey("gpu_reset_models", f"not a regex: {exc}") from None
        if self.hardware_profile is not None and self.hardware_profile not in PROFILES:
            raise InvalidKey(
                "hardware_profile", f"unknown hardware profile (one of: {', '.join(PROFILES)})"
            )


class ControllerConfig(Section):
    listen: Annotated[str, Meta(description="host:port of the HTTP API")] = "127.0.0.1:8090"
    database_url: Annotated[str, Meta(description="SQLAlchemy URL")] = (
        "sqlite:////var/lib/babysitter/babysitter.db"
    )
    cluster_secret_file: Annotated[Path, Meta(description="secret node tokens derive from")] = Path(
        "/etc/babysitter/cluster.secret"
    )
    admin_token_file: Annotated[Path, Meta(description="admin API token")] = Path(
        "/etc/babysitter/admin.token"
    )
    read_token_file: Annotated[Path | None, Meta(description="optional read-only API token")] = None
    heartbeat_timeout_s: Annotated[
        float, Meta(gt=0, description="no report for this long -> node state unknown")
    ] = 120.0
    retention_days: Annotated[
        float, Meta(gt=0, description="reports/findings older are pruned")
    ] = 30.0
    history_lookback_days: Annotated[
        float,
        Meta(
            gt=0,
            description="a node's history (its findings, remediations and timeline; the "
            "findings listing) shows this many days by default; an explicit since= reaches "
            "further back within retention_days. 14: gpud's XID lookback in `gpud run` (its "
            "events retention period)",
        ),
    ] = 14.0
    clean_report_minutes: Annotated[
        float,
        Meta(
            ge=0,
            description="clean reports (worst ok/info) are kept this long; the node row keeps the "
            "latest state, reports with findings stay for retention_days",
        ),
    ] = 10.0
    audit_retention_days: Annotated[
        float,
        Meta(gt=0, description="audit log entries (every action, its evidence) older are pruned"),
    ] = 400.0
    ui_refresh_s: Annotated[
        float, Meta(ge=1, le=3600, description="the status page (/ui) reloads itself this often")
    ] = 5.0
    maintenance_reservation_user: Annotated[
        str,
        Meta(
            pattern=r"^[A-Za-z0-9_.-]{1,64}$",
            description="Slurm user a maintenance window's MAINT reservation is made for",
        ),
    ] = "root"
    retention_interval_s: Annotated[
        float, Meta(gt=0, description="how often the retention thread looks for rows to prune")
    ] = 10.0
    retention_batch: Annotated[
        int,
        Meta(
            ge=1,
            description="most reports one retention transaction deletes (fewer while a delete "
            "holds the database longer than ~10 ms)",
        ),
    ] = 2000
    loop_interval_s: Annotated[float, Meta(gt=0, description="policy/remediation loop period")] = (
        1.0
    )
    remediation: Annotated[
        bool, Meta(description="run the policy/remediation loop here (false: ingest-only replica)")
    ] = True
    max_body_bytes: Annotated[
        int, Meta(ge=4096, le=64 << 20, description="largest report body accepted (else 413)")
    ] = 1 << 20
    max_open_findings_per_node: Annotated[
        int, Meta(ge=8, description="open findings kept per node; the rest fold into a count")
    ] = 256
    header_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            description="a connection with no request in flight (headers never finished, or "
            "idle) is closed after this long",
        ),
    ] = 10.0
    keep_alive_s: Annotated[
        float, Meta(gt=0, description="idle keep-alive connections are closed after this long")
    ] = 5.0
    max_connections: Annotated[
        int,
        Meta(
            ge=16,
            description="open HTTP connections at most (also kept 128 below the file-descriptor "
            "limit, whose soft value is raised to the hard one at start); past it the oldest "
            "idle ones are closed, and a new one is refused when none is idle",
        ),
    ] = 4096
    body_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            description="a request's body must arrive whole within this long of its headers, "
            "else the connection is closed (a slowly trickled body holds no connection)",
        ),
    ] = 30.0
    node_requests_in_flight: Annotated[
        int,
        Meta(
            ge=1,
            description="requests one node's token may have in flight (more: 429 at once, the "
            "body unread)",
        ),
    ] = 4
    client_requests_in_flight: Annotated[
        int,
        Meta(
            ge=4,
            description="requests without a valid token (health, metrics, status page views) "
            "one client address may have in flight (more: 429 at once)",
        ),
    ] = 32
    login_requests_in_flight: Annotated[
        int,
        Meta(
            ge=4,
            description="status page logins in flight from all clients together, a quarter of "
            "it from one client address (more: 429 at once)",
        ),
    ] = 16
    login_failures: Annotated[
        int,
        Meta(
            ge=1,
            description="wrong tokens one client address may type into the login form before "
            "it waits (429, the wait doubling with each further failure, up to 15 min)",
        ),
    ] = 5
    public_url: Annotated[
        Annotated[str, Meta(pattern=r"^https?://[^\s]+$")] | None,
        Meta(
            description="the URL browsers reach the controller at (e.g. https://babysitter.example"
            " behind a TLS proxy); the status page's login cookie is Secure unless this is an "
            "http:// URL",
        ),
    ] = None
    tls_cert_file: Annotated[
        Path | None, Meta(description="serve HTTPS with this certificate (PEM, chain included)")
    ] = None
    tls_key_file: Annotated[
        Path | None, Meta(description="private key of tls_cert_file (mode 0600)")
    ] = None
    metrics_interval_s: Annotated[
        float,
        Meta(
            gt=0,
            le=300,
            description="/metrics: the values read from the database (nodes by verdict, drains, "
            "alerts firing, ...) are read this often and published; a scrape only sends them",
        ),
    ] = 5.0
    metrics_token_file: Annotated[
        Path | None,
        Meta(
            description="/metrics needs `Authorization: Bearer` with this token (or the admin or "
            "read token); unset: /metrics is open to anyone who reaches the port",
        ),
    ] = None
    ui_requests_per_s: Annotated[
        float,
        Meta(
            gt=0,
            description="status page (/ui) requests one client address may make per second, "
            "on average (a token bucket; past it: 429 with Retry-After)",
        ),
        # a reverse proxy is one address for every browser: 50 tabs at the default 5 s refresh;
        # one client past it is still bounded, and all of them by the reader workers
    ] = 10.0
    ui_burst: Annotated[
        int, Meta(ge=1, description="status page requests one client address may make at once")
    ] = 50
    metrics_requests_per_s: Annotated[
        float,
        Meta(
            gt=0,
            description="/metrics requests one client address may make per second, on average "
            "(a token bucket; past it: 429 with Retry-After)",
        ),
    ] = 1.0
    metrics_burst: Annotated[
        int, Meta(ge=1, description="/metrics requests one client address may make at once")
    ] = 5
    reader_workers: Annotated[
        int,
        Meta(
            ge=1,
            le=64,
            description="/ui and /metrics requests served at once, all clients together (their "
            "own budget: readers never take ingest's or the loop's share)",
        ),
    ] = 2
    reader_queue: Annotated[
        int,
        Meta(
            ge=0,
            description="/ui and /metrics requests that may wait for a reader worker; past it: "
            "429 with Retry-After",
        ),
    ] = 64


class SlurmConfig(Section):
    backend: Annotated[
        Literal["cli", "rest", "pyslurm"], Meta(description="how to talk to Slurm")
    ] = "cli"
    reason_prefix: Annotated[str, Meta(min_length=1, description="owned drain reasons")] = (
        "babysitter:"
    )
    slurmrestd_url: Annotated[
        str | None, Meta(description="http://host:port or unix:///path/to/socket (rest backend)")
    ] = None
    jwt_token_file: Annotated[Path | None, Meta(description="JWT for slurmrestd over TCP")] = None
    slurm_conf: Annotated[Path | None, Meta(description="SLURM_CONF for client commands")] = None
    bin_dir: Annotated[Path | None, Meta(description="directory holding sinfo/scontrol/...")] = None
    timeout_s: Annotated[float, Meta(gt=0, description="timeout of every Slurm call")] = 15.0
    node_refresh_s: Annotated[
        float,
        Meta(
            ge=0,
            description="re-read all Slurm nodes at most this often (one node-info RPC each; "
            "drains and resumes re-check their own nodes first)",
        ),
    ] = 5.0
    job_scan_s: Annotated[
        float,
        Meta(ge=0, description="list jobs (babysat-job tracking, hang checks) at most this often"),
    ] = 5.0


class PolicyConfig(Section):
    dry_run: Annotated[bool, Meta(description="decide, log and alert, but never change Slurm")] = (
        False
    )
    max_drained_fraction: Annotated[
        float, Meta(gt=0, le=1, description="never drain more of a partition than this")
    ] = 0.1
    min_drainable: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_MIN_DRAINABLE,
            description="nodes per partition always drainable, whatever the fraction "
            f"(at most {MAX_MIN_DRAINABLE})",
        ),
    ] = 1
    max_drains_per_hour: Annotated[
        int,
        Meta(
            ge=0,
            le=MAX_DRAINS_PER_HOUR,
            description=f"drain budget per rolling hour (at most {MAX_DRAINS_PER_HOUR})",
        ),
    ] = 20
    resume_after_clean_checks: Annotated[
        int,
        Meta(
            ge=1,
            description=(
                "consecutive reports with nothing drain-worthy (warnings and job-owned"
                " findings do not count) before an auto-resume"
            ),
        ),
    ] = 3
    requeue_hung_jobs: Annotated[
        bool, Meta(description="requeue a babysat job that hangs (else only alert)")
    ] = False
    link_requeue_grace_s: Annotated[
        float,
        Meta(
            ge=0,
            le=3600,
            description="a node drained for a link fault (InfiniBand port down, link retrained) "
            "is drained at once, but its babysat jobs are requeued only if the link is still down "
            "after this long (NCCL's IB retry budget, ~30 s at its defaults); 0: requeue at once",
        ),
    ] = 30.0
    idle_gpu_util_percent: Annotated[
        float, Meta(ge=0, le=100, description="GPU utilisation below this counts as idle")
    ] = 5.0
    straggler_threshold: Annotated[
        float,
        Meta(gt=0, lt=1, description="slow: this far below the fleet median of its GPU model"),
    ] = 0.10
    straggler_consecutive: Annotated[
        int, Meta(ge=1, description="slow measurements in a row before node_slow is raised")
    ] = 3
    straggler_action: Annotated[
        Literal["alert", "drain"],
        Meta(description="node_slow only alerts (warning), or also drains"),
    ] = "alert"
    validate_before_resume: Annotated[
        bool | None,
        Meta(
            description="run a validation job on a node before it returns "
            "(default: on when [validation] partition is set)"
        ),
    ] = None
    xid_escalation_count: Annotated[
        int,
        Meta(
            ge=1,
            description="the same fatal XID on one GPU this many times within "
            "xid_escalation_window_h pages for hardware inspection (xid_escalation)",
        ),
    ] = 5
    xid_escalation_window_h: Annotated[
        float, Meta(gt=0, description="the window of xid_escalation_count (hours)")
    ] = 24.0
    lemon_drains: Annotated[
        int,
        Meta(
            ge=1,
            description="babysitter drains of one node within lemon_window_days that make it "
            "a lemon node (lemon_node alert)",
        ),
    ] = 3
    lemon_window_days: Annotated[
        float, Meta(gt=0, description="the window of lemon_drains (days)")
    ] = 7.0


class ValidationConfig(Section):
    """The validation job a node passes before it returns to service ([policy]
    validate_before_resume). It runs inside a MAINT reservation babysitter creates on the node,
    so no user job can land there before the verdict."""

    partition: Annotated[str | None, Meta(description="partition for validation jobs")] = None
    user: Annotated[
        str, Meta(description="reservation user (the controller submits as itself)")
    ] = "root"
    command: Annotated[
        list[str], Meta(description="the job's command ({node} is replaced by the node name)")
    ] = field(default_factory=lambda: ["babysitter", "validate", "--json"])
    sbatch_args: Annotated[
        list[str], Meta(description="extra sbatch arguments, e.g. --qos=maint ({node} is replaced)")
    ] = field(default_factory=list)
    time_limit_min: Annotated[int, Meta(ge=1, description="the job's time limit (minutes)")] = 20
    output_dir: Annotated[
        Path,
        Meta(
            description="job output files: must be shared with the nodes (the controller reads "
            "each job's verdict there; no readable verdict is a failed validation)"
        ),
    ] = Path("/var/lib/babysitter/validation")
    max_attempts: Annotated[
        int, Meta(ge=1, description="failed validations of a node before it waits for an admin")
    ] = 3
    stress_s: Annotated[
        float, Meta(ge=0, description="`babysitter validate`: sustained matmul")
    ] = 60.0
    nccl_command: Annotated[
        list[str] | None,
        Meta(description="`babysitter validate`: NCCL test to run (e.g. all_reduce_perf ...)"),
    ] = None
    min_busbw_gbps: Annotated[
        float, Meta(ge=0, description="fail below this NCCL bus bandwidth")
    ] = 0.0
    dcgmi: Annotated[
        str,
        Meta(
            description="`babysitter validate`: the DCGM CLI (a path, or a name on PATH); "
            "where it is missing the matmul test alone validates"
        ),
    ] = "dcgmi"
    dcgm_after_reset: Annotated[
        int, Meta(ge=0, le=4, description="`dcgmi diag -r` level after a GPU reset (0: none)")
    ] = 2
    dcgm_after_reboot: Annotated[
        int, Meta(ge=0, le=4, description="`dcgmi diag -r` level after a reboot (0: none)")
    ] = 3
    dcgm_memory_fault: Annotated[
        int,
        Meta(
            ge=0,
            le=4,
            description="`dcgmi diag -r` level at least, for a memory fault (ECC, row "
            "remapping, memory XIDs) (0: no minimum)",
        ),
    ] = 3
    dcgm_other: Annotated[
        int,
        Meta(
            ge=0,
            le=4,
            description="`dcgmi diag -r` level for any other validation (a cleared fault, "
            "`babysitter validate` by hand) (0: none)",
        ),
    ] = 1
    dcgm_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            description="`dcgmi diag` is killed after this long: a failed validation (keep "
            "it under time_limit_min; level 3 takes about 15 min, level 4 1-2 h)",
        ),
    ] = 1080.0

    def enabled(self, policy: PolicyConfig) -> bool:
        if policy.validate_before_resume is not None:
            return policy.validate_before_resume
        return self.partition is not None


class FabricConfig(Section):
    """Topology-aware correlation (loop/decide/fabric.py): fabric findings from several nodes
    under one switch are one `switch_suspected` incident, not a drain and a page per node.
    Defaults: a leaf failure takes every port below it down within seconds, so a minute's
    window catches it whole while independent node faults (a few a day on 2,000 nodes) almost
    never line up 3 under one switch in it; 3 nodes (or half of a small switch) is the fewest
    that is unlikely by chance."""

    enabled: Annotated[
        bool, Meta(description="correlate fabric findings by Slurm's topology (switches)")
    ] = True
    min_nodes: Annotated[
        int, Meta(ge=2, description="nodes under one switch that make it suspect")
    ] = 3
    min_fraction: Annotated[
        float,
        Meta(
            gt=0,
            le=1,
            description="...or this fraction of its nodes, whichever is fewer (at least 2)",
        ),
    ] = 0.5
    window_s: Annotated[
        float, Meta(gt=0, description="onsets within this many seconds count as together")
    ] = 60.0
    hold_s: Annotated[
        float,
        Meta(
            ge=0,
            description="a fabric fault waits this long for its siblings before it is a node "
            "fault (no drain and page for the first node of a failing switch)",
        ),
    ] = 10.0
    on_switch: Annotated[
        Literal["drain", "keep"],
        Meta(
            description="drain the nodes under a suspected switch in one call, or keep them in "
            "service (alert and move babysat jobs away only)"
        ),
    ] = "drain"
    requeue_jobs: Annotated[
        bool, Meta(description="requeue babysat jobs on those nodes, excluding them")
    ] = True
    topology_refresh_s: Annotated[
        float,
        Meta(gt=0, description="re-read `scontrol show topology` this often (it changes rarely)"),
    ] = 300.0


_Fraction = Annotated[float, Meta(gt=0, le=1)]
_Count = Annotated[int, Meta(ge=1, le=MAX_SCOPE_COUNT)]


class BlastRadiusConfig(Section):
    """Node-drain caps by scope (loop/decide/blast.py, enforced right before each drain by
    controller/loop/admit/admission.py): a tripped cap stops new node drains in its scope only;
    resumes and other scopes go on. A scope is capped when its fraction or count is set
    (limit = the smaller, at least 1). Drains done and pending count, a switch incident's
    included (its own switch's cap does not hold it back). On by default at half of a switch,
    a partition and the cluster: no automatic fault, one-line or switch-wide, takes more out of
    service; set a fraction to 1.0 to lift a scope's cap. docs/fabric.md suggests values.
    A reload that raises or unsets one is refused unless the new file opts in ([reload])."""

    switch_fraction: Annotated[
        _Fraction | None, Meta(description="of the nodes under one leaf switch")
    ] = 0.5
    switch_count: Annotated[
        _Count | None,
        Meta(description=f"nodes under one leaf switch (at most {MAX_SCOPE_COUNT})"),
    ] = None
    domain_fraction: Annotated[
        _Fraction | None,
        Meta(description="of the nodes of one NVLink domain (loop/fabric/nvlink_domain.py)"),
    ] = 0.5
    domain_count: Annotated[
        _Count | None, Meta(description=f"nodes of one NVLink domain (at most {MAX_SCOPE_COUNT})")
    ] = None
    partition_fraction: Annotated[
        _Fraction | None, Meta(description="of the nodes of one partition")
    ] = 0.5
    partition_count: Annotated[
        _Count | None, Meta(description=f"nodes of one partition (at most {MAX_SCOPE_COUNT})")
    ] = None
    cluster_fraction: Annotated[_Fraction | None, Meta(description="of every node in Slurm")] = 0.5
    cluster_count: Annotated[
        _Count | None, Meta(description=f"nodes cluster-wide (at most {MAX_SCOPE_COUNT})")
    ] = None


# the rungs of the remediation ladder (controller/loop/decide/ladder.py `Rung` has exactly these)
RungName = Literal["reset_gpu", "restart_fabric", "reboot", "inspect", "rma"]


class RemediationConfig(Section):
    """Self-healing (docs/self-healing.md): a node babysitter drained for a reboot- or
    reset-class fault climbs the remediation ladder (reset the GPU, reboot through Slurm), is
    validated on its GPUs and resumed; a failed rung goes to the next one, a node remediated too
    often is a lemon and stays drained for an admin."""

    enabled: Annotated[
        bool,
        Meta(
            description="climb the ladder automatically (a reboot also needs a RebootProgram in "
            "slurm.conf; without one the node escalates to inspect, saying why)"
        ),
    ] = True
    ladder: Annotated[
        dict[str, list[RungName]],
        Meta(
            description="site overrides, one fault class each: finding code or `xid.<N>` -> "
            'rungs in order, e.g. {"xid.79" = ["reboot", "rma"]}'
        ),
    ] = field(default_factory=dict)
    max_concurrent_reboots: Annotated[
        int,
        Meta(
            ge=1,
            le=MAX_CONCURRENT_REBOOTS,
            description=f"nodes in reboot at once, at least (K; at most {MAX_CONCURRENT_REBOOTS})",
        ),
    ] = 2
    max_concurrent_fraction: Annotated[
        float,
        Meta(ge=0, le=1, description="... or this fraction of the node's partition, if more (P)"),
    ] = 0.05
    reboot_timeout_s: Annotated[
        float, Meta(gt=0, description="a node not back this long after its reboot pages")
    ] = 1800.0
    lemon_remediations: Annotated[
        int, Meta(ge=1, description="remediations within lemon_window_days that make a lemon")
    ] = 3
    lemon_window_days: Annotated[float, Meta(gt=0, description="the lemon ledger's window")] = 7.0
    reset_timeout_s: Annotated[
        float,
        Meta(gt=0, description="an ordered GPU reset the agent has not answered this long fails"),
    ] = 300.0
    nextstate: Annotated[
        Literal["DOWN", "RESUME"],
        Meta(
            description="`scontrol reboot nextstate=`; either way a maintenance reservation "
            "keeps jobs off the node until its validation passes"
        ),
    ] = "DOWN"


# the lowest severity a sink receives: Severity's own order decides (no second order here)
ROUTES = ("route_alertmanager", "route_slack", "route_pagerduty", "route_webhook")


class RmaConfig(Section):
    """RMA evidence (controller/loop/heal/rma.py, agent/rma.py): when a node becomes a lemon or a
    reset / reboot rung fails, its agent collects `nvidia-bug-report.sh` output and the recent
    kernel log, and the controller stores them with the node's ledger history and findings as
    one archive, linked from the alert, the node page and `babysitter nodes NODE`."""

    enabled: Annotated[
        bool, Meta(description="collect an RMA evidence archive for lemons and failed rungs")
    ] = True
    archive_dir: Annotated[
        Path, Meta(description="controller: where the archives are kept (tar.gz, one per event)")
    ] = Path("/var/lib/babysitter/rma")
    bug_report_command: Annotated[
        list[str],
        Meta(
            description="agent: the bug report, run in an empty temporary directory; it must "
            "write nvidia-bug-report.log.gz there (missing: recorded as absent)"
        ),
    ] = field(default_factory=lambda: ["nvidia-bug-report.sh"])
    bug_report_timeout_s: Annotated[
        float, Meta(gt=0, description="agent: the bug report is killed after this long")
    ] = 300.0
    max_mb: Annotated[
        float,
        Meta(gt=0, description="agent: a bug report larger than this is left out (said so)"),
    ] = 50.0
    kernel_log_command: Annotated[
        list[str] | None,
        Meta(
            description="agent: the recent kernel log (default: `journalctl -k -n LINES`, "
            "else `dmesg`)"
        ),
    ] = None
    kernel_log_lines: Annotated[
        int, Meta(ge=1, description="agent: at most this many recent kernel-log lines")
    ] = 2000
    collect_timeout_s: Annotated[
        float,
        Meta(
            gt=0,
            description="controller: no upload from the agent this long after the order is "
            "a failed collection (alerted, never dropped)",
        ),
    ] = 900.0
    keep_days: Annotated[
        float,
        Meta(
            gt=0,
            description="controller: an archive's file is deleted this long after it was "
            "collected (its row stays, state expired)",
        ),
    ] = 365.0


class AlertsConfig(Section):
    alertmanager_url: Annotated[str | None, Meta(description="Alertmanager base URL (v2 API)")] = (
        None
    )
    slack_webhook_url: Annotated[str | None, Meta(description="Slack incoming webhook URL")] = None
    pagerduty_routing_key: Annotated[str | None, Meta(description="PagerDuty Events v2 key")] = None
    pagerduty_url: Annotated[str, Meta(description="PagerDuty Events v2 endpoint")] = (
        "https://events.pagerduty.com/v2/enqueue"
    )
    webhook_url: Annotated[str | None, Meta(description="generic JSON webhook")] = None
    job_slack_webhook_url: Annotated[
        str | None,
        Meta(
            description="Slack webhook of the channel for job alerts (job_log_*: a job's own "
            "log); they never go to on-call's Slack or PagerDuty, and reach Alertmanager and the "
            "webhook labelled route=job"
        ),
    ] = None
    timeout_s: Annotated[float, Meta(gt=0, description="timeout of every alert delivery")] = 5.0
    route_alertmanager: Annotated[Severity, Meta(description="lowest severity sent there")] = (
        Severity.WARNING
    )
    route_slack: Annotated[Severity, Meta(description="lowest severity sent to Slack")] = (
        Severity.WARNING
    )
    route_pagerduty: Annotated[Severity, Meta(description="lowest severity that pages")] = (
        Severity.CRITICAL
    )
    route_webhook: Annotated[Severity, Meta(description="lowest severity sent to the webhook")] = (
        Severity.INFO
    )
    repeat_interval_s: Annotated[
        float, Meta(gt=0, description="re-send a still-firing alert after this long")
    ] = 4 * 3600
    group_threshold: Annotated[
        int,
        Meta(
            ge=1, description="more new alerts of one condition per round become one grouped alert"
        ),
    ] = 3
    alertmanager_resend_s: Annotated[
        float,
        Meta(
            gt=0, description="re-send firing alerts to Alertmanager this often (endsAt = 4x ahead)"
        ),
    ] = 60.0
    queue_size: Annotated[
        int, Meta(ge=1, description="alert deliveries waiting for the sender; more are dropped")
    ] = 1000

    def __post_init__(self) -> None:
        for name in ROUTES:
            if getattr(self, name) is Severity.OK:
                raise InvalidKey(name, "a route's lowest severity is info, warning or critical")


class ReloadConfig(Section):
    """What a reload (`systemctl reload`, SIGHUP) may change: babysitter/reload.py."""

    allow_loosening_caps: Annotated[
        bool,
        Meta(
            description="a reload may raise or unset a cap (policy drain caps, blast_radius, "
            "concurrent reboots and SDC tests); without it such a file is refused like an "
            "invalid one. Set it for that reload, then remove it (docs/deploy.md#caps)"
        ),
    ] = False


class ChecksConfig(Section):
    """`[checks.<name>]`: each check's settings, from its folder (checks/<name>/settings.py)."""

    gpu: GpuCheckConfig = field(default_factory=GpuCheckConfig)
    xid: XidCheckConfig = field(default_factory=XidCheckConfig)
    host: HostCheckConfig = field(default_factory=HostCheckConfig)
    infiniband: InfinibandCheckConfig = field(default_factory=InfinibandCheckConfig)
    fabric: FabricCheckConfig = field(default_factory=FabricCheckConfig)
    nccl: NcclCheckConfig = field(default_factory=NcclCheckConfig)
    sdc: SdcCheckConfig = field(default_factory=SdcCheckConfig)


class Config(Section):
    agent: AgentConfig = field(default_factory=AgentConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    fabric: FabricConfig = field(default_factory=FabricConfig)
    blast_radius: BlastRadiusConfig = field(default_factory=BlastRadiusConfig)
    remediation: RemediationConfig = field(default_factory=RemediationConfig)
    rma: RmaConfig = field(default_factory=RmaConfig)
    reload: ReloadConfig = field(default_factory=ReloadConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)


def _is_json(annotation: Any) -> bool:
    """A value given as JSON in the environment: a section, list, dict, set or tuple (also
    inside `X | None`)."""
    annotation = plain(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_json(a) for a in typing.get_args(annotation) if a is not type(None))
    if section_model(annotation) is not None:
        return True
    return (origin or annotation) in (list, dict, set, frozenset, tuple)


def _is_bool(annotation: Any) -> bool:
    annotation = plain(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_bool(a) for a in typing.get_args(annotation))
    return annotation is bool


# the spellings of a boolean the environment has always accepted (msgspec itself takes
# true/false/1/0 only)
_ENV_BOOLS = {
    **dict.fromkeys(("true", "1", "yes", "on", "y", "t"), "true"),
    **dict.fromkeys(("false", "0", "no", "off", "n", "f"), "false"),
}


def _deep_update(base: dict[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _deep_update(out[k], v)
        else:
            out[k] = v
    return out


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings `BABYSITTER_<SECTION>__<KEY>` variables give, as nested dicts."""
    out: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        parts = name[len(ENV_PREFIX) :].lower().split(ENV_NESTED)
        model: type[Section] = Config
        path: list[str] = []
        value: Any = None
        for i, part in enumerate(parts):
            ann = section_fields(model).get(part)
            if ann is None:
                if path:  # a typo inside a section: validation names it as an unknown key
                    path.append(ENV_NESTED.join(parts[i:]))
                    value = raw
                break  # not a section (BABYSITTER_CONFIG, ...): ignored, as always
            path.append(part)
            last = i == len(parts) - 1
            sub = section_model(plain(ann))
            if not last and sub is not None:
                model = sub
                continue
            if not last:  # a key of a dict setting (or of a plain one: validation refuses it)
                path.append(ENV_NESTED.join(parts[i + 1 :]))
                value = raw
            else:
                value = raw
                if _is_json(ann):
                    import json  # only here: `babysitter check` pays nothing for it

                    try:
                        value = json.loads(raw)
                    except ValueError as exc:
                        raise ConfigError(
                            f"invalid configuration in the environment: {name} is not valid "
                            f"JSON ({exc})"
                        ) from None
                elif _is_bool(ann):
                    value = _ENV_BOOLS.get(raw.strip().lower(), raw)
            break
        if value is None:
            continue
        nested: Any = value
        for key in reversed(path):
            nested = {key: nested}
        out = _deep_update(out, nested)
    return out


# Keys older releases accepted: an old config fails with what to write instead (a silently
# ignored key would leave the site believing a setting it does not have).
REMOVED: dict[str, str] = {
    "checks.kmsg": "removed (nothing read it): the kernel-log XID scan is the xid.kmsg check, "
    "set in [checks.xid]",
    "checks.gpu.profile": "removed: set [agent] hardware_profile",
    "checks.infiniband.profile": "removed: set [agent] hardware_profile",
    "checks.nccl.profile": "removed: set [agent] hardware_profile",
}


def _dec_hook(tp: Any, obj: Any) -> Any:
    if tp is Path:
        if isinstance(obj, str):
            return Path(obj)
        raise ValueError("Expected a path (a string)")
    raise NotImplementedError(f"{tp!r} is not a config type")


def parse_config(data: Mapping[str, Any], origin: str = "the given settings") -> Config:
    """Validate settings given as nested dicts (a parsed TOML file); ConfigError (one line,
    naming the key) on any problem."""
    try:
        return _convert(data, Config)
    except msgspec.ValidationError as exc:
        from babysitter.config_errors import explain  # only once a config is bad

        why = explain(data, Config, _convert, REMOVED) or str(exc)
        raise ConfigError(f"invalid configuration in {origin}: {why}") from None


def _convert(data: Any, type_: Any) -> Any:
    return msgspec.convert(data, type_, strict=False, str_keys=True, dec_hook=_dec_hook)


def as_dict(section: Section, exclude_defaults: bool = False) -> dict[str, Any]:
    """A section as plain JSON-able data (paths as text); with `exclude_defaults`, only the
    keys set to something else than their default."""
    out: dict[str, Any] = {}
    for f in msgspec.structs.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, Section):
            sub = as_dict(value, exclude_defaults)
            if sub or not exclude_defaults:
                out[f.name] = sub
            continue
        if exclude_defaults:
            default = f.default if f.default is not msgspec.NODEFAULT else None
            if f.default_factory is not msgspec.NODEFAULT:
                default = f.default_factory()
            if value == default:
                continue
        out[f.name] = msgspec.to_builtins(value, enc_hook=str)
    return out


def config_path(explicit: str | Path | None = None) -> Path | None:
    """The file to read: --config, else $BABYSITTER_CONFIG, else the default if it exists."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_CONFIG)
    if env:
        return Path(env)
    return DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None


def load_config(path: str | Path | None = None) -> Config:
    """Load and validate; raises ConfigError (one line, naming the key) on any problem."""
    p = config_path(path)
    data: dict[str, Any] = {}
    origin = "environment/defaults"
    if p is not None:
        import tomllib  # only when there is a file (`babysitter check` counts every import)

        origin = f"{p} (or BABYSITTER_* environment)"
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {p}") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {p}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p} is not valid TOML: {exc}") from exc
    # the environment wins over the file, key by key
    data = _deep_update(data, env_overrides(os.environ))
    return parse_config(data, origin)
