"""Grafana unified-alerting rules as code, built with Grafana's SDK (its rule, query and
server-side expression builders), for file provisioning (``apiVersion: 1``) and for
Grafana's alerting provisioning HTTP API (``farm dashboards push``).

Each rule is the usual three-step Grafana rule: ``A`` runs SQL on the farm's store
(table format: every text column becomes a label, so each row is its own alert
instance), ``B`` reduces each instance to its last value, ``C`` fires when that is
above a threshold. Templates use ``.Values``/``.Labels``, never ``$``: provisioning
expands ``$NAME`` as an environment variable in some fields.

No contact point is provisioned: the rules carry the label ``team=mtp-farm`` so a
team routes them with a notification policy of its own (docs/store-and-dashboards.md,
"The dashboards"); until then Grafana's default policy and contact point apply.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from grafana_foundation_sdk.builders import alerting, expr
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting as alerting_models

from farm.dashboards import queries as q
from farm.dashboards.model import DATASOURCE_UID, PostgresQuery, _Built
from farm.frozen import Frozen

__all__ = [
    "ALERT_FOLDER",
    "ALERT_GROUP",
    "ALERT_INTERVAL_S",
    "AlertRule",
    "alert_provisioning",
    "alert_rules",
]

ALERT_FOLDER = "MTP farm"
ALERT_GROUP = "mtp-farm"
# The farm raises alerts once per sweep (nightly); checking every 5 minutes is plenty.
ALERT_INTERVAL_S = 300
_EXPRESSION_UID = "__expr__"
# Fields of the API's rule model that a provisioning file gives by its group instead.
# (The SDK models the API's rules and groups, not the file format around them.)
_API_ONLY = ("folderUID", "ruleGroup", "orgID")


class AlertRule(Frozen):
    """One rule: fires for every row of ``sql`` whose number is above ``threshold``."""

    uid: str
    title: str
    sql: str
    threshold: float = 0
    severity: Literal["critical", "warning"]
    summary: str
    description: str
    # An empty result means nothing is wrong (no open alert, no sweep yet).
    no_data_state: Literal["OK", "NoData", "Alerting"] = "OK"

    def build(self) -> alerting.Rule:
        """The SDK's builder of this rule (``ProvisionedAlertRule``, the API's model)."""
        # The SQL bounds itself (queries.ALERT_WINDOW_DAYS, no macros: file provisioning
        # would expand them); Grafana requires a range all the same.
        sql = (
            alerting.Query("A")
            .datasource_uid(DATASOURCE_UID)
            .relative_time_range(alerting_models.RelativeTimeRange(from_val=86400, to=0))
            .model(_Built(PostgresQuery(self.sql)))
        )
        last = expr.TypeReduce().ref_id("B").expression("A").reducer("last")
        above = (
            expr.TypeThreshold()
            .ref_id("C")
            .expression("B")
            .conditions(
                [
                    expr.ExprTypeThresholdConditions().evaluator(
                        expr.ExprTypeThresholdConditionsEvaluator()
                        .type("gt")
                        .params([self.threshold])
                    )
                ]
            )
        )
        return (
            alerting.Rule(self.title)
            .uid(self.uid)
            .condition("C")
            .with_query(sql)
            .with_query(alerting.Query("B").datasource_uid(_EXPRESSION_UID).model(last))
            .with_query(alerting.Query("C").datasource_uid(_EXPRESSION_UID).model(above))
            .no_data_state(self.no_data_state)
            .exec_err_state("Error")
            .for_val("0m")
            .annotations({"summary": self.summary, "description": self.description})
            .labels({"team": "mtp-farm", "severity": self.severity})
            .is_paused(False)
        )

    def render(self) -> dict[str, Any]:
        """The rule as a provisioning file holds it: the API's model without where the
        rule lives (the file's group says that)."""
        rule = self.render_for_api("")
        for placement in _API_ONLY:
            rule.pop(placement)
        return rule

    def render_for_api(self, folder_uid: str, org_id: int = 1) -> dict[str, Any]:
        """The rule as ``POST``/``PUT /api/v1/provisioning/alert-rules`` take it
        (``ProvisionedAlertRule``): the file model plus where the rule lives. Grafana
        uses the token's organisation whatever ``orgID`` says, but requires the field."""
        built = self.build().folder_uid(folder_uid).rule_group(ALERT_GROUP).org_id(org_id)
        rule: dict[str, Any] = json.loads(json.dumps(built.build(), cls=JSONEncoder))
        return rule


def alert_rules() -> tuple[AlertRule, ...]:
    """The farm's rules: open farm alerts, and failed cells in each job's newest sweep."""
    return (
        AlertRule(
            uid="mtp-farm-open-alerts",
            title="Open farm alerts",
            sql=q.ALERT_OPEN_ALERTS,
            severity="warning",
            summary='{{ index .Values "B" }} open {{ .Labels.farm_severity }} farm alert(s)',
            description=(
                "The farm raised regression alerts that nobody triaged yet. "
                "`farm alerts list` shows them; `farm alerts triage ID STATE` triages."
            ),
        ),
        AlertRule(
            uid="mtp-farm-latest-sweep-failed-cells",
            title="Latest sweep has failed cells",
            sql=q.ALERT_FAILED_CELLS,
            severity="critical",
            summary=(
                '{{ index .Values "B" }} failed cell(s) in the newest sweep of {{ .Labels.job }}'
            ),
            description=(
                "Cells of the job's newest sweep failed or their build failed. "
                "`farm report latest` names them; the Farm health dashboard shows the errors."
            ),
        ),
    )


def _duration(seconds: int) -> str:
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def alert_provisioning() -> dict[str, Any]:
    """The provisioning document (``provisioning/alerting/*.yaml``) with every rule."""
    return {
        "apiVersion": 1,
        "groups": [
            {
                "orgId": 1,
                "name": ALERT_GROUP,
                "folder": ALERT_FOLDER,
                "interval": _duration(ALERT_INTERVAL_S),
                "rules": [r.render() for r in alert_rules()],
            }
        ],
    }
