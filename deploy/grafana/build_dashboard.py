"""Build deploy/grafana/babysitter-dashboard.json with Grafana's own typed builders
(grafana-foundation-sdk, a dev dependency). Regenerate after changing a panel:

    .venv/bin/python deploy/grafana/build_dashboard.py --write

tests/test_grafana_dashboard.py checks the JSON is what this builds and that every query
names only metrics the running controller exports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    StackingMode,
)
from grafana_foundation_sdk.models.dashboard import DataSourceRef

OUT = Path(__file__).with_name("babysitter-dashboard.json")
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "[$__rate_interval]"


def query(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref)
    return q.legend_format(legend) if legend else q


def series(title: str, unit: str, *queries: prometheus.Dataquery, stacked: bool = False):
    p = timeseries.Panel().title(title).unit(unit).datasource(DS).span(12).height(8)
    if stacked:
        p = p.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(40)
    for q in queries:
        p = p.with_target(q)
    return p


def number(title: str, expr: str, unit: str = "none", legend: str = "") -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .color_mode(BigValueColorMode.VALUE)
        .graph_mode(BigValueGraphMode.AREA)
        .unit(unit)
        .datasource(DS)
        .span(4)
        .height(4)
        .with_target(query(expr, legend))
    )


def quantiles(metric: str, by: str = "") -> list[prometheus.Dataquery]:
    group = f"le{', ' + by if by else ''}"
    name = f"{{{{{by}}}}} " if by else ""
    return [
        query(
            f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{RATE})))",
            f"{name}p{int(q * 100)}",
            ref,
        )
        for q, ref in ((0.5, "A"), (0.99, "B"))
    ]


def build() -> dash.Dashboard:
    return (
        dash.Dashboard("babysitter: fleet and on-call")
        .uid("babysitter-oncall")
        .tags(["babysitter", "slurm", "gpu"])
        .refresh("30s")
        .time("now-6h", "now")
        .with_variable(dash.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_row(dash.Row("Fleet"))
        .with_panel(number("Unhealthy nodes", 'sum(babysitter_nodes{verdict="unhealthy"})'))
        .with_panel(number("Drained by babysitter", "sum(babysitter_nodes_drained)"))
        .with_panel(number("Oldest drain", "max(babysitter_oldest_drain_age_seconds)", "s"))
        .with_panel(number("Silent nodes", "sum(babysitter_nodes_silent)"))
        .with_panel(number("Guard tripped", "max(babysitter_guard_tripped)"))
        .with_panel(number("In maintenance", "sum(babysitter_nodes_in_maintenance)"))
        .with_panel(
            series(
                "Fleet by verdict",
                "none",
                query("sum by (verdict) (babysitter_nodes)", "{{verdict}}"),
                stacked=True,
            )
        )
        .with_panel(
            series(
                "Firing alerts by condition",
                "none",
                query("sum by (condition) (babysitter_alerts_firing)", "{{condition}}"),
                stacked=True,
            )
        )
        .with_panel(
            series(
                "Nodes not healthy per leaf switch (Slurm topology)",
                "none",
                query(
                    'sum by (switch, verdict) (babysitter_switch_nodes{verdict!="healthy"})',
                    "{{switch}} {{verdict}}",
                ),
                stacked=True,
            )
        )
        .with_panel(
            series(
                "Nodes per leaf switch",
                "none",
                query("sum by (switch) (babysitter_switch_nodes)", "{{switch}}"),
            )
        )
        .with_row(dash.Row("Drains"))
        .with_panel(
            series(
                "Drains by reason (rule)",
                "none",
                query(
                    f'sum by (rule) (increase(babysitter_actions_total{{kind="drain"}}{RATE}))',
                    "{{rule}}",
                ),
                stacked=True,
            )
        )
        .with_panel(
            series(
                "Drain outcomes",
                "none",
                query(f"sum by (outcome) (increase(babysitter_drains_total{RATE}))", "{{outcome}}"),
                stacked=True,
            )
        )
        .with_panel(
            series("Fault -> drain latency", "s", *quantiles("babysitter_fault_to_drain_seconds"))
        )
        .with_panel(
            series(
                "Drain age (oldest) and drained nodes",
                "s",
                query("max(babysitter_oldest_drain_age_seconds)", "oldest drain"),
            )
        )
        .with_panel(
            series(
                "Drained nodes by owner and remediation",
                "none",
                query(
                    "count by (owner, remediation) (max by (node, owner, remediation) "
                    "(babysitter_node_drained_seconds))",
                    "{{owner}} {{remediation}}",
                ),
                stacked=True,
            )
        )
        .with_panel(
            series(
                "Stuck drains: babysitter's, no remediation in progress (age per node)",
                "s",
                query(
                    'max by (node, remediation) (babysitter_node_drained_seconds{owner="babysitter",'
                    ' remediation!~"waiting|resetting|rebooting|validating"})',
                    "{{node}} {{remediation}}",
                ),
            )
        )
        .with_row(dash.Row("Jobs and actions"))
        .with_panel(
            series(
                "Requeues by outcome",
                "none",
                query(
                    f"sum by (outcome) (increase(babysitter_requeues_total{RATE}))", "{{outcome}}"
                ),
                stacked=True,
            )
        )
        .with_panel(
            series(
                "Actions by kind and result (audit log)",
                "none",
                query(
                    f"sum by (kind, result) (increase(babysitter_actions_total{RATE}))",
                    "{{kind}} {{result}}",
                ),
            )
        )
        .with_row(dash.Row("Alert delivery"))
        .with_panel(
            series(
                "Alert notifications by sink and state",
                "none",
                query(
                    f"sum by (sink, state) (increase(babysitter_alerts_total{RATE}))",
                    "{{sink}} {{state}}",
                ),
            )
        )
        .with_panel(
            series(
                "Alert notifications dropped",
                "none",
                query(f"sum(increase(babysitter_alerts_dropped_total{RATE}))", "dropped"),
            )
        )
        .with_row(dash.Row("Controller"))
        .with_panel(
            series("Controller loop tick", "s", *quantiles("babysitter_loop_tick_seconds", "loop"))
        )
        .with_panel(series("Report ingest latency", "s", *quantiles("babysitter_ingest_latency_seconds")))
        .with_panel(
            series(
                "Reports ingested",
                "reqps",
                query(f"sum by (result) (rate(babysitter_reports_ingested_total{RATE}))", "{{result}}"),
            )
        )
        .with_panel(
            series(
                "Leader and loop errors",
                "none",
                query("max by (instance) (babysitter_controller_leader)", "leader {{instance}}"),
                query(
                    f"sum by (item) (increase(babysitter_loop_item_errors_total{RATE}))",
                    "errors {{item}}",
                    "B",
                ),
            )
        )
    )


def render() -> str:
    board = build().build()
    for i, panel in enumerate(board.panels or [], start=1):
        panel.id_val = i  # the builders leave ids unset (rows 0); Grafana wants them unique
    return json.dumps(board, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        OUT.write_text(render())
    else:
        sys.stdout.write(render())
