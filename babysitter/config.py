"""Configuration: TOML file + `BABYSITTER_<SECTION>__<KEY>` environment overrides, validated by
pydantic. An unknown key or a bad value is a `ConfigError` naming the key.

The environment is read here (`env_overrides`), not by pydantic-settings: importing that costs
~0.1 s of CPU and a few MB on every `babysitter check` (the HealthCheckProgram mode). The rules
are the ones it had: names are case-insensitive, `__` descends into a section, a list/dict/
section value is JSON, anything else a string for pydantic to convert, the environment wins
over the file key by key, and names that are no setting are ignored.

Each section is its own model; checks own their `[checks.<name>]` model below. Add keys to the
model of the part you build, with a default and a one-line description (the README's
configuration reference is generated from these models).
"""

from __future__ import annotations

import json
import os
import socket
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from babysitter.errors import ConfigError
from babysitter.finding import Severity
from babysitter.hardware.profiles import GPU_THRESHOLDS, PROFILES
from babysitter.hardware.xids import KNOWN_XIDS, XidClass

DEFAULT_CONFIG_PATH = Path("/etc/babysitter/babysitter.toml")
ENV_CONFIG = "BABYSITTER_CONFIG"
ENV_PREFIX = "BABYSITTER_"
ENV_NESTED = "__"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


class AgentConfig(Section):
    controller_url: str = Field("http://127.0.0.1:8090", description="controller base URL")
    node_name: str = Field(default_factory=_short_hostname, description="Slurm node name")
    sysfs_root: Path = Field(Path("/"), description="root under which sys/class/... is read")
    kmsg_path: Path = Field(Path("/dev/kmsg"), description="kernel log to scan for NVRM XIDs")
    spool_path: Path = Field(
        Path("/var/lib/babysitter/spool.db"), description="durable report spool (SQLite)"
    )
    spool_max_reports: int = Field(10_000, ge=10, description="spool bound; oldest dropped")
    interval_s: float = Field(30.0, gt=0, description="report cycle; checks keep own intervals")
    fast_interval_s: float = Field(
        1.0, gt=0, description="fast-tier period: cheap reads of job-killing faults (GPU lost, DBE)"
    )
    boot_id_path: Path = Field(
        Path("/proc/sys/kernel/random/boot_id"),
        description="identifies this boot: event findings are kept until it changes",
    )
    token_file: Path = Field(
        Path("/etc/babysitter/node.token"), description="this node's API token"
    )
    request_timeout_s: float = Field(5.0, gt=0, description="HTTP timeout for report shipping")
    metrics_listen: str | None = Field(
        None, description="host:port for the agent's Prometheus metrics (off when unset)"
    )
    enabled_checks: list[str] | None = Field(
        None,
        description="checks to run, by name or prefix (default: every non-invasive check that "
        "is supported; an invasive one, sdc.matmul or nccl.perf, runs only when named here)",
    )
    ca_file: Path | None = Field(
        None, description="CA bundle to verify an https controller with (agent and CLI)"
    )
    hardware_profile: str | None = Field(
        None,
        description="what the node is built as: " + ", ".join(PROFILES) + " (default: detected "
        "from the GPU model; a configured profile also requires its GPU count and IB fabric)",
    )

    @field_validator("hardware_profile")
    @classmethod
    def _known_profile(cls, v: str | None) -> str | None:
        if v is not None and v not in PROFILES:
            raise ValueError(f"unknown hardware profile (one of: {', '.join(PROFILES)})")
        return v


class ControllerConfig(Section):
    listen: str = Field("127.0.0.1:8090", description="host:port of the HTTP API")
    database_url: str = Field(
        "sqlite:////var/lib/babysitter/babysitter.db", description="SQLAlchemy URL"
    )
    cluster_secret_file: Path = Field(
        Path("/etc/babysitter/cluster.secret"), description="secret node tokens derive from"
    )
    admin_token_file: Path = Field(
        Path("/etc/babysitter/admin.token"), description="admin API token"
    )
    read_token_file: Path | None = Field(None, description="optional read-only API token")
    heartbeat_timeout_s: float = Field(
        120.0, gt=0, description="no report for this long -> node state unknown"
    )
    retention_days: float = Field(30.0, gt=0, description="reports/findings older are pruned")
    clean_report_minutes: float = Field(
        10.0,
        ge=0,
        description="clean reports (worst ok/info) are kept this long; the node row keeps the "
        "latest state, reports with findings stay for retention_days",
    )
    retention_interval_s: float = Field(
        10.0, gt=0, description="how often the retention thread looks for rows to prune"
    )
    retention_batch: int = Field(
        2000, ge=1, description="reports deleted per transaction by the retention thread"
    )
    loop_interval_s: float = Field(1.0, gt=0, description="policy/remediation loop period")
    remediation: bool = Field(
        True, description="run the policy/remediation loop here (false: ingest-only replica)"
    )
    max_body_bytes: int = Field(
        1 << 20, ge=4096, le=64 << 20, description="largest report body accepted (else 413)"
    )
    max_open_findings_per_node: int = Field(
        256, ge=8, description="open findings kept per node; the rest fold into a count"
    )
    tls_cert_file: Path | None = Field(
        None, description="serve HTTPS with this certificate (PEM, chain included)"
    )
    tls_key_file: Path | None = Field(None, description="private key of tls_cert_file (mode 0600)")


class SlurmConfig(Section):
    backend: Literal["cli", "rest", "pyslurm"] = Field("cli", description="how to talk to Slurm")
    reason_prefix: str = Field("babysitter:", min_length=1, description="owned drain reasons")
    slurmrestd_url: str | None = Field(
        None, description="http://host:port or unix:///path/to/socket (rest backend)"
    )
    jwt_token_file: Path | None = Field(None, description="JWT for slurmrestd over TCP")
    slurm_conf: Path | None = Field(None, description="SLURM_CONF for client commands")
    bin_dir: Path | None = Field(None, description="directory holding sinfo/scontrol/...")
    timeout_s: float = Field(15.0, gt=0, description="timeout of every Slurm call")
    node_refresh_s: float = Field(
        5.0,
        ge=0,
        description="re-read all Slurm nodes at most this often (one node-info RPC each; "
        "drains and resumes re-check their own nodes first)",
    )
    job_scan_s: float = Field(
        5.0, ge=0, description="list jobs (babysat-job tracking, hang checks) at most this often"
    )


class PolicyConfig(Section):
    dry_run: bool = Field(False, description="decide, log and alert, but never change Slurm")
    max_drained_fraction: float = Field(
        0.1, gt=0, le=1, description="never drain more of a partition than this"
    )
    min_drainable: int = Field(
        1, ge=0, description="nodes per partition always drainable, whatever the fraction"
    )
    max_drains_per_hour: int = Field(20, ge=0, description="drain budget per rolling hour")
    resume_after_clean_checks: int = Field(
        3, ge=1, description="consecutive clean reports before an auto-resume"
    )
    requeue_hung_jobs: bool = Field(
        False, description="requeue a babysat job that hangs (else only alert)"
    )
    idle_gpu_util_percent: float = Field(
        5.0, ge=0, le=100, description="GPU utilisation below this counts as idle"
    )
    straggler_threshold: float = Field(
        0.10, gt=0, lt=1, description="slow: this far below the fleet median of its GPU model"
    )
    straggler_consecutive: int = Field(
        3, ge=1, description="slow measurements in a row before node_slow is raised"
    )
    straggler_action: Literal["alert", "drain"] = Field(
        "alert", description="node_slow only alerts (warning), or also drains"
    )
    validate_before_resume: bool | None = Field(
        None,
        description="run a validation job on a node before it returns "
        "(default: on when [validation] partition is set)",
    )


class ValidationConfig(Section):
    """The validation job a node passes before it returns to service ([policy]
    validate_before_resume). It runs inside a MAINT reservation babysitter creates on the node,
    so no user job can land there before the verdict."""

    partition: str | None = Field(None, description="partition for validation jobs")
    user: str = Field("root", description="reservation user (the controller submits as itself)")
    command: list[str] = Field(
        default_factory=lambda: ["babysitter", "validate", "--json"],
        description="the job's command ({node} is replaced by the node name)",
    )
    sbatch_args: list[str] = Field(
        default_factory=list,
        description="extra sbatch arguments, e.g. --qos=maint ({node} is replaced)",
    )
    time_limit_min: int = Field(20, ge=1, description="the job's time limit (minutes)")
    output_dir: Path = Field(
        Path("/var/lib/babysitter/validation"),
        description="job output files (shared with the nodes, or the verdict is the exit code)",
    )
    max_attempts: int = Field(
        3, ge=1, description="failed validations of a node before it waits for an admin"
    )
    stress_s: float = Field(60.0, ge=0, description="`babysitter validate`: sustained matmul")
    nccl_command: list[str] | None = Field(
        None, description="`babysitter validate`: NCCL test to run (e.g. all_reduce_perf ...)"
    )
    min_busbw_gbps: float = Field(0.0, ge=0, description="fail below this NCCL bus bandwidth")

    def enabled(self, policy: PolicyConfig) -> bool:
        if policy.validate_before_resume is not None:
            return policy.validate_before_resume
        return self.partition is not None


def _routable(v: Severity) -> Severity:
    if v is Severity.OK:
        raise ValueError("a route's lowest severity is info, warning or critical")
    return v


# the lowest severity a sink receives: Severity's own order decides (no second order here)
RouteSeverity = Annotated[Severity, AfterValidator(_routable)]


class AlertsConfig(Section):
    alertmanager_url: str | None = Field(None, description="Alertmanager base URL (v2 API)")
    slack_webhook_url: str | None = Field(None, description="Slack incoming webhook URL")
    pagerduty_routing_key: str | None = Field(None, description="PagerDuty Events v2 key")
    pagerduty_url: str = Field(
        "https://events.pagerduty.com/v2/enqueue", description="PagerDuty Events v2 endpoint"
    )
    webhook_url: str | None = Field(None, description="generic JSON webhook")
    timeout_s: float = Field(5.0, gt=0, description="timeout of every alert delivery")
    route_alertmanager: RouteSeverity = Field(
        Severity.WARNING, description="lowest severity sent there"
    )
    route_slack: RouteSeverity = Field(
        Severity.WARNING, description="lowest severity sent to Slack"
    )
    route_pagerduty: RouteSeverity = Field(
        Severity.CRITICAL, description="lowest severity that pages"
    )
    route_webhook: RouteSeverity = Field(
        Severity.INFO, description="lowest severity sent to the webhook"
    )
    repeat_interval_s: float = Field(
        4 * 3600, gt=0, description="re-send a still-firing alert after this long"
    )
    group_threshold: int = Field(
        3, ge=1, description="more new alerts of one condition per round become one grouped alert"
    )
    alertmanager_resend_s: float = Field(
        60.0,
        gt=0,
        description="re-send firing alerts to Alertmanager this often (endsAt = 4x ahead)",
    )
    queue_size: int = Field(
        1000, ge=1, description="alert deliveries waiting for the sender; more are dropped"
    )


class CheckConfig(Section):
    """Keys every check understands."""

    enabled: bool = Field(True, description="run this check")
    interval_s: float | None = Field(None, gt=0, description="override the check's interval")
    timeout_s: float | None = Field(None, gt=0, description="override the check's timeout")
    signal_intervals: dict[str, float | Literal["fast"]] = Field(
        default_factory=dict,
        description='per-signal interval overrides, {"gpu.memory/sbe_volatile" = 30 | "fast"}',
    )

    @field_validator("signal_intervals")
    @classmethod
    def _positive(cls, v: dict[str, float | Literal["fast"]]) -> dict[str, float | Literal["fast"]]:
        bad = sorted(k for k, x in v.items() if x != "fast" and not float(x) > 0)
        if bad:
            raise ValueError(f'{", ".join(bad)}: an interval is seconds > 0 or "fast"')
        return v


class GpuCheckConfig(CheckConfig):
    expected_count: int | None = Field(
        None, ge=0, description="GPUs this node must have (default: the configured profile's)"
    )
    thresholds: dict[str, float] = Field(
        default_factory=dict,
        description="overrides of the hardware profile's GPU thresholds, by name: "
        + ", ".join(GPU_THRESHOLDS),
    )

    @field_validator("thresholds")
    @classmethod
    def _known_thresholds(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(GPU_THRESHOLDS))
        if unknown:
            raise ValueError(
                f"unknown threshold {', '.join(unknown)} (known: {', '.join(GPU_THRESHOLDS)})"
            )
        return v


class XidCheckConfig(CheckConfig):
    actions: dict[int, XidClass] = Field(
        default_factory=dict,
        description="XID -> class overrides of the NVIDIA catalog "
        "(reboot, reset_gpu, inspect, app, ignore)",
    )

    @field_validator("actions")
    @classmethod
    def _known_xids(cls, v: dict[int, XidClass]) -> dict[int, XidClass]:
        unknown = sorted(set(v) - KNOWN_XIDS)
        if unknown:
            raise ValueError(
                f"XID {', '.join(map(str, unknown))} is not in the XID catalog (a typo?)"
            )
        return v

    sbe_events_per_hour_warn: float = Field(
        100.0, gt=0, description="corrected-ECC events per GPU per hour that make a warning"
    )


class HostCheckConfig(CheckConfig):
    paths: list[Path] = Field(default_factory=lambda: [Path("/tmp")], description="disk paths")
    min_free_gb: float = Field(5.0, ge=0, description="free space below this is a warning")
    min_free_memory_fraction: float = Field(0.05, ge=0, le=1, description="memory floor")
    mounts: list[Path] = Field(default_factory=list, description="mounts that must exist")
    check_slurmd: bool = Field(True, description="slurmd must be running")


class InfinibandCheckConfig(CheckConfig):
    expected_ports: int | None = Field(
        None, ge=0, description="ACTIVE ports expected (default: the hardware profile's)"
    )
    expected_rate_gbps: float | None = Field(
        None, gt=0, description="rate each port must have (default: the hardware profile's)"
    )
    flap_recovery_s: float | None = Field(
        None, gt=0, description="opt-in: forgive flaps after the port is stable this long"
    )


class NcclCheckConfig(CheckConfig):
    all_reduce_perf: Path | None = Field(None, description="path of nccl-tests all_reduce_perf")
    job_log_globs: list[str] = Field(
        default_factory=list, description="where to find babysat jobs' stdout/stderr"
    )
    min_busbw_gbps: float | None = Field(
        None, gt=0, description="bus bandwidth floor, GB/s (default: the hardware profile's)"
    )
    gpus: int = Field(8, ge=1, description="GPUs all_reduce_perf uses (-g)")
    min_bytes: str = Field("1G", description="all_reduce_perf -b")
    max_bytes: str = Field("16G", description="all_reduce_perf -e")


# the dtypes the SDC test's host-side verifier supports (checks/sdc/runner.py NP_DTYPES)
SdcDtype = Literal["float32", "float64", "float16"]


class SdcCheckConfig(CheckConfig):
    backend: Literal["auto", "numpy", "torch", "cupy"] = Field("auto", description="matmul lib")
    size: int = Field(2048, ge=16, description="matrix size n (n x n)")
    dtype: SdcDtype = Field("float32", description="element type: " + ", ".join(get_args(SdcDtype)))
    seed: int = Field(1234, description="input seed")


class ChecksConfig(Section):
    gpu: GpuCheckConfig = Field(default_factory=GpuCheckConfig)
    xid: XidCheckConfig = Field(default_factory=XidCheckConfig)
    host: HostCheckConfig = Field(default_factory=HostCheckConfig)
    infiniband: InfinibandCheckConfig = Field(default_factory=InfinibandCheckConfig)
    nccl: NcclCheckConfig = Field(default_factory=NcclCheckConfig)
    sdc: SdcCheckConfig = Field(default_factory=SdcCheckConfig)


class Config(Section):
    agent: AgentConfig = Field(default_factory=AgentConfig)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    checks: ChecksConfig = Field(default_factory=ChecksConfig)


def _model(annotation: Any) -> type[BaseModel] | None:
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def _is_json(annotation: Any) -> bool:
    """A value given as JSON in the environment: a section, list, dict, set or tuple (also
    inside `X | None`)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_json(a) for a in typing.get_args(annotation) if a is not type(None))
    if _model(annotation) is not None:
        return True
    return (origin or annotation) in (list, dict, set, frozenset, tuple)


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
        model: type[BaseModel] = Config
        path: list[str] = []
        value: Any = None
        for i, part in enumerate(parts):
            field = model.model_fields.get(part)
            if field is None:
                if path:  # a typo inside a section: validation names it as an unknown key
                    path.append(ENV_NESTED.join(parts[i:]))
                    value = raw
                break  # not a section (BABYSITTER_CONFIG, ...): ignored, as always
            path.append(part)
            ann = field.annotation
            last = i == len(parts) - 1
            if not last and _model(ann) is not None:
                model = _model(ann)  # type: ignore[assignment]
                continue
            if not last:  # a key of a dict setting (or of a plain one: validation refuses it)
                path.append(ENV_NESTED.join(parts[i + 1 :]))
                value = raw
            else:
                value = raw
                if _is_json(ann):
                    try:
                        value = json.loads(raw)
                    except ValueError as exc:
                        raise ConfigError(
                            f"invalid configuration in the environment: {name} is not valid "
                            f"JSON ({exc})"
                        ) from None
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


def _format_validation_error(err: ValidationError, origin: str) -> str:
    parts = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = REMOVED.get(key, "unknown key")
        value = e.get("input")
        hide = e["type"] == "extra_forbidden" or isinstance(value, dict)
        shown = "" if hide else f" (got {value!r})"
        parts.append(f"{key}: {msg}{shown}")
    return f"invalid configuration in {origin}: " + "; ".join(parts)


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
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, origin)) from exc
