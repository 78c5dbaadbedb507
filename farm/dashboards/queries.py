"""The SQL behind the farm's dashboards and alert rules (PostgreSQL dialect).

Each query reads the store as ``farm.store`` writes it:

- ``metric`` is long format: one row per counter of a variant run, ``position`` NULL
  for the scalar counters (``drafts``, ``draft_tokens``, ``accepted``) and 0..k-1 for
  ``accepted_per_pos`` (``farm.store.cells._counter_rows``).
- A *cell key* is what makes results comparable across sweeps: the variant's
  ``farm.comparable.ComparableKey``, stored by ``farm.store`` as
  ``variant_run.comparable_key`` (indexed; also in each planned variant of
  ``cell.variants``) with its text form in ``variant_run.key_label``.
- Figures are ratios of summed counters, like ``SpecCounters``: AL = 1 + accepted /
  drafts, acceptance rate = accepted / draft_tokens, position i = accepted_per_pos[i] /
  drafts; accuracy is the share of correct among scored (``correct`` not NULL)
  requests that did not fail (``farm.analysis.stats.accuracy``).
- "Latest" and "previous" sweeps are by sweep id within one job, as ``farm alerts
  check`` walks history (``farm.store.history.history_sweeps``).

Dashboard queries use Grafana's ``$__timeFilter(column)`` macro and ``${var:sqlstring}``
variables (each value single-quoted, quotes doubled: safe inside ``IN (...)``).
Alert rule queries use neither: Grafana alerting has no dashboard variables, and file
provisioning would expand ``$__timeFilter`` as an environment variable.

Every query is bounded, so that it costs the same on a year of nightlies as on a
month (``bench/store_scale.py`` times each on a year): panels and variables read only
the sweeps in the dashboard's time range ("latest" is the newest sweep *in the range*), the
previous sweep is looked for among the :data:`PREVIOUS_WITHIN` sweeps before the
latest (once per cell key, not per row), alert rules read the last
:data:`ALERT_WINDOW_DAYS` days. The alert queries read ``alert`` by state: open
alerts stay on the board however old they are, and the farm keeps them few by
deduplicating them.
"""

from __future__ import annotations

__all__ = [
    "ALERT_FAILED_CELLS",
    "ALERT_OPEN_ALERTS",
    "ALERT_TRIAGE",
    "ALERT_WINDOW_DAYS",
    "AL_SPREAD",
    "CELL_DURATIONS_BY_NODE",
    "FAILED_CELLS",
    "LATEST_FAILED_CELLS",
    "LATEST_STORED_SPREAD",
    "LATEST_SWEEP",
    "LATEST_SWEEP_BY_CATEGORY",
    "LATEST_SWEEP_BY_CONTEXT",
    "LATEST_SWEEP_CELLS",
    "LATEST_SWEEP_PER_POSITION",
    "OPEN_ALERTS",
    "OPEN_ALERTS_BY_STATE",
    "OPEN_ALERT_COUNT",
    "PREVIOUS_WITHIN",
    "RECENT_SWEEPS",
    "SERIES_ACCEPTANCE_LENGTH",
    "SERIES_ACCEPTANCE_RATE",
    "STARTUP_BY_NODE",
    "STORED_SPREAD_BY_SWEEP",
    "SWEEPS_BY_STATUS",
    "VARIABLE_ENGINE",
    "VARIABLE_GRAPH_MODE",
    "VARIABLE_JOBS",
    "VARIABLE_JOB_LATEST_FIRST",
    "VARIABLE_MODEL",
    "VARIABLE_MTP_DEPTH",
    "VARIABLE_THINKING",
]

_JOB = "s.job IN (${job:sqlstring})"
# Sweeps in the dashboard's time range of the selected jobs.
_IN_RANGE = f"$__timeFilter(s.started_at)\n    AND {_JOB}"

# How many earlier sweeps of the job the latest sweep's table searches for a cell key's
# previous AL: a month of nightlies, enough to bridge a cell that failed for weeks.
PREVIOUS_WITHIN = 30
# Alert rules look at sweeps of the last week: a job that stopped running a week ago
# no longer fires (its instance resolves), one that skipped a night still does.
ALERT_WINDOW_DAYS = 7

# The planned variants of cell ``c`` (``farm.store`` keeps them as JSON, each with its
# request-axis values under ``axes`` and its comparable key).
_PLANNED_VARIANTS = (
    "SELECT e->'axes'->>'thinking' AS thinking, e->'axes'->>'workload' AS workload, "
    "coalesce((e->'axes'->>'context')::int, 0) AS context, "
    "e->>'comparable_key' AS comparable_key FROM json_array_elements(c.variants) e"
)
# A variant run's context length (none before the axis existed).
_RUN_CONTEXT = "coalesce((v.axes->>'context')::int, 0)"


def _axis_filters(thinking: str) -> str:
    """The dashboard's axis variables, on cell ``c`` and the given thinking column."""
    return (
        "c.engine IN (${engine:sqlstring})\n"
        "    AND c.model IN (${model:sqlstring})\n"
        "    AND c.planned_graph_mode IN (${graph_mode:sqlstring})\n"
        "    AND c.mtp_depth::text IN (${mtp_depth:sqlstring})\n"
        f"    AND {thinking} IN (${{thinking:sqlstring}})"
    )


def _key_counters() -> str:
    """CTE ``key_counters``: summed scalar counters per sweep in the time range and cell
    key (ok cells)."""
    return f"""key_counters AS (
  SELECT s.id AS sweep_id, s.job, s.started_at, v.comparable_key, v.key_label AS cell_key,
    (sum(m.value) FILTER (WHERE m.name = 'drafts'))::float8 AS drafts,
    (sum(m.value) FILTER (WHERE m.name = 'draft_tokens'))::float8 AS draft_tokens,
    (sum(m.value) FILTER (WHERE m.name = 'accepted'))::float8 AS accepted
  FROM sweep s
  JOIN cell c ON c.sweep_id = s.id
  JOIN variant_run v ON v.cell_row_id = c.id
  JOIN metric m ON m.variant_run_id = v.id AND m.position IS NULL
  WHERE {_IN_RANGE}
    AND c.status = 'ok'
    AND {_axis_filters("v.thinking")}
  GROUP BY s.id, s.job, s.started_at, v.comparable_key, v.key_label
)"""


# The newest sweep in the time range of each selected job.
_LATEST = f"""latest AS (
  SELECT max(s.id) AS sweep_id FROM sweep s
  WHERE {_IN_RANGE}
  GROUP BY s.job
)"""

# --- MTP acceptance overview ----------------------------------------------------------

SERIES_ACCEPTANCE_LENGTH = f"""WITH {_key_counters()}
SELECT started_at AS "time", cell_key AS metric, 1 + accepted / drafts AS "AL"
FROM key_counters
WHERE drafts > 0
ORDER BY 1, 2"""

SERIES_ACCEPTANCE_RATE = f"""WITH {_key_counters()}
SELECT started_at AS "time", cell_key AS metric, accepted / draft_tokens AS "acceptance rate"
FROM key_counters
WHERE draft_tokens > 0
ORDER BY 1, 2"""

LATEST_SWEEP = f"""WITH {_LATEST}
SELECT s.id AS sweep, s.job, s.status, s.started_at AS started, s.finished_at AS finished,
  count(c.id) FILTER (WHERE c.status = 'ok') AS ok,
  count(c.id) FILTER (WHERE c.status = 'failed') AS failed,
  count(c.id) FILTER (WHERE c.status = 'build_failed') AS build_failed,
  count(c.id) FILTER (WHERE c.status = 'planned') AS planned
FROM latest l
JOIN sweep s ON s.id = l.sweep_id
LEFT JOIN cell c ON c.sweep_id = s.id
GROUP BY s.id
ORDER BY s.id DESC"""

# One row per planned variant of the latest sweep's cells (failed cells included, from
# the plan stored on the cell), with the change against the same key's previous sweep:
# counters are summed only for the latest sweep and the PREVIOUS_WITHIN sweeps before
# it, only for the latest sweep's keys, and each key's previous sweep is picked once.
LATEST_SWEEP_CELLS = f"""WITH {_LATEST},
planned AS (
  SELECT s.id AS sweep_id, s.job, c.id AS cell_row_id, c.ordinal, c.status,
    c.family, c.engine, c.model, c.planned_graph_mode AS graph_mode, c.mtp_depth,
    c.sliding_window, pv.thinking, pv.workload, pv.context, pv.comparable_key
  FROM latest l
  JOIN sweep s ON s.id = l.sweep_id
  JOIN cell c ON c.sweep_id = s.id
  CROSS JOIN LATERAL ({_PLANNED_VARIANTS}) pv
  WHERE {_axis_filters("pv.thinking")}
),
earlier AS (
  SELECT l.sweep_id AS latest_id, e.id AS sweep_id
  FROM latest l
  JOIN sweep ls ON ls.id = l.sweep_id
  CROSS JOIN LATERAL (
    SELECT s.id FROM sweep s
    WHERE s.job = ls.job AND s.id < ls.id
    ORDER BY s.id DESC
    LIMIT {PREVIOUS_WITHIN}
  ) e
),
key_counters AS (
  SELECT c.sweep_id, v.comparable_key,
    (sum(m.value) FILTER (WHERE m.name = 'drafts'))::float8 AS drafts,
    (sum(m.value) FILTER (WHERE m.name = 'draft_tokens'))::float8 AS draft_tokens,
    (sum(m.value) FILTER (WHERE m.name = 'accepted'))::float8 AS accepted
  FROM cell c
  JOIN variant_run v ON v.cell_row_id = c.id
  JOIN metric m ON m.variant_run_id = v.id AND m.position IS NULL
  WHERE c.sweep_id IN (SELECT sweep_id FROM latest UNION ALL SELECT sweep_id FROM earlier)
    AND c.status = 'ok'
    AND v.comparable_key IN (SELECT comparable_key FROM planned)
  GROUP BY c.sweep_id, v.comparable_key
),
previous AS (
  SELECT DISTINCT ON (e.latest_id, k.comparable_key) e.latest_id, k.comparable_key,
    k.sweep_id, 1 + k.accepted / k.drafts AS al
  FROM earlier e
  JOIN key_counters k ON k.sweep_id = e.sweep_id
  WHERE k.drafts > 0
  ORDER BY e.latest_id, k.comparable_key, k.sweep_id DESC
),
scored AS (
  SELECT v.cell_row_id, v.thinking, v.workload, {_RUN_CONTEXT} AS context,
    (sum(vs.correct)::float8 / NULLIF(sum(vs.scored), 0)) AS accuracy,
    NULLIF(sum(vs.scored), 0) AS scored
  FROM variant_run v
  JOIN variant_summary vs ON vs.variant_run_id = v.id
  WHERE v.cell_row_id IN (SELECT cell_row_id FROM planned)
  GROUP BY v.cell_row_id, v.thinking, v.workload, {_RUN_CONTEXT}
),
figures AS (
  SELECT p.*, 1 + k.accepted / NULLIF(k.drafts, 0) AS al,
    k.accepted / NULLIF(k.draft_tokens, 0) AS acceptance_rate,
    a.accuracy, a.scored, prev.sweep_id AS previous_sweep, prev.al AS previous_al
  FROM planned p
  LEFT JOIN key_counters k ON k.sweep_id = p.sweep_id AND k.comparable_key = p.comparable_key
  LEFT JOIN scored a ON a.cell_row_id = p.cell_row_id
    AND a.thinking = p.thinking AND a.workload = p.workload AND a.context = p.context
  LEFT JOIN previous prev ON prev.latest_id = p.sweep_id
    AND prev.comparable_key = p.comparable_key
)
SELECT job, sweep_id AS sweep, engine, family, model, graph_mode AS "graph mode",
  mtp_depth AS "MTP depth", sliding_window AS "sliding window", thinking,
  context AS "context tokens", workload, status,
  al AS "AL", acceptance_rate AS "acceptance rate", accuracy, scored AS "scored requests",
  previous_sweep AS "previous sweep", previous_al AS "previous AL",
  al - previous_al AS "AL change", (al - previous_al) / previous_al AS "AL change rel"
FROM figures
ORDER BY job, ordinal, thinking, context, workload"""

LATEST_SWEEP_PER_POSITION = f"""WITH {_LATEST},
runs AS (
  SELECT v.key_label AS cell_key, v.id AS run_id
  FROM latest l
  JOIN cell c ON c.sweep_id = l.sweep_id
  JOIN variant_run v ON v.cell_row_id = c.id
  WHERE c.status = 'ok'
    AND {_axis_filters("v.thinking")}
),
drafts AS (
  SELECT r.cell_key, sum(m.value)::float8 AS drafts
  FROM runs r JOIN metric m ON m.variant_run_id = r.run_id
  WHERE m.name = 'drafts' AND m.position IS NULL
  GROUP BY r.cell_key
),
positions AS (
  SELECT r.cell_key, m.position, sum(m.value)::float8 AS accepted
  FROM runs r JOIN metric m ON m.variant_run_id = r.run_id
  WHERE m.name = 'accepted_per_pos' AND m.position IS NOT NULL
  GROUP BY r.cell_key, m.position
)
SELECT p.cell_key AS cell, 'pos ' || p.position AS position, p.accepted / d.drafts AS rate
FROM positions p
JOIN drafts d ON d.cell_key = p.cell_key
WHERE d.drafts > 0
ORDER BY p.cell_key, p.position"""

# Each request's category, drafts and accepted tokens, unpacked from the packed row by
# position (farm.store.tables.RequestNumbersRow); only the latest sweep's rows are read.
LATEST_SWEEP_BY_CATEGORY = f"""WITH {_LATEST},
requests AS (
  SELECT v.key_label AS cell_key, k.category, d.drafts::float8 AS drafts,
    a.accepted::float8 AS accepted
  FROM latest l
  JOIN cell c ON c.sweep_id = l.sweep_id
  JOIN variant_run v ON v.cell_row_id = c.id
  JOIN request_numbers n ON n.variant_run_id = v.id
  CROSS JOIN LATERAL json_array_elements_text(n.categories) WITH ORDINALITY AS k(category, i)
  JOIN LATERAL json_array_elements_text(n.drafts) WITH ORDINALITY AS d(drafts, i) ON d.i = k.i
  JOIN LATERAL json_array_elements_text(n.accepted) WITH ORDINALITY AS a(accepted, i)
    ON a.i = k.i
  WHERE c.status = 'ok'
    AND n.categories IS NOT NULL
    AND n.drafts IS NOT NULL
    AND {_axis_filters("v.thinking")}
)
SELECT cell_key AS cell, category, count(*) AS requests, sum(drafts) AS drafts,
  1 + sum(accepted) / sum(drafts) AS "AL"
FROM requests
WHERE category IS NOT NULL AND drafts IS NOT NULL
GROUP BY cell_key, category
HAVING sum(drafts) > 0
ORDER BY cell_key, category"""

# Each variant of the latest sweep by its context length (the request axis ``context``,
# in the variant's stored axes; none before the axis existed), grouped with the same
# variant at its other lengths: the cell key without its ``.ctxN`` term.
LATEST_SWEEP_BY_CONTEXT = f"""WITH {_LATEST},
runs AS (
  SELECT regexp_replace(v.key_label, '\\.ctx[0-9]+', '') AS cell_key,
    {_RUN_CONTEXT} AS context, v.id AS run_id
  FROM latest l
  JOIN cell c ON c.sweep_id = l.sweep_id
  JOIN variant_run v ON v.cell_row_id = c.id
  WHERE c.status = 'ok'
    AND {_axis_filters("v.thinking")}
),
counts AS (
  SELECT r.cell_key, r.context,
    (sum(m.value) FILTER (WHERE m.name = 'drafts'))::float8 AS drafts,
    (sum(m.value) FILTER (WHERE m.name = 'accepted'))::float8 AS accepted
  FROM runs r JOIN metric m ON m.variant_run_id = r.run_id AND m.position IS NULL
  GROUP BY r.cell_key, r.context
)
SELECT cell_key AS cell, context AS "context tokens", drafts, 1 + accepted / drafts AS "AL"
FROM counts
WHERE drafts > 0
ORDER BY cell_key, context"""

# --- Farm health ----------------------------------------------------------------------

SWEEPS_BY_STATUS = f"""SELECT date_trunc('day', s.started_at AT TIME ZONE 'UTC') AS "time",
  s.status AS metric, count(*) AS sweeps
FROM sweep s
WHERE {_IN_RANGE}
GROUP BY 1, 2
ORDER BY 1, 2"""

RECENT_SWEEPS = f"""SELECT s.id AS sweep, s.job, s.status, s.host, s.started_at AS started,
  extract(epoch FROM s.finished_at - s.started_at)::float8 AS duration,
  count(c.id) FILTER (WHERE c.status = 'ok') AS ok,
  count(c.id) FILTER (WHERE c.status = 'failed') AS failed,
  count(c.id) FILTER (WHERE c.status = 'build_failed') AS build_failed,
  count(c.id) FILTER (WHERE c.status = 'planned') AS planned
FROM sweep s
LEFT JOIN cell c ON c.sweep_id = s.id
WHERE {_IN_RANGE}
GROUP BY s.id
ORDER BY s.id DESC"""

FAILED_CELLS = f"""SELECT s.id AS sweep, s.job, s.started_at AS started, c.cell_id AS cell,
  c.status, c.node, c.engine, c.model, c.planned_graph_mode AS "graph mode",
  c.mtp_depth AS "MTP depth", c.sliding_window AS "sliding window", c.error
FROM cell c
JOIN sweep s ON s.id = c.sweep_id
WHERE {_IN_RANGE}
  AND c.status IN ('failed', 'build_failed')
ORDER BY s.id DESC, c.ordinal"""

CELL_DURATIONS_BY_NODE = f"""SELECT coalesce(c.node, 'unknown') AS node,
  avg(c.startup_s)::float8 AS "startup (mean)",
  max(c.startup_s)::float8 AS "startup (max)",
  avg(c.generation_s)::float8 AS "generation (mean)",
  max(c.generation_s)::float8 AS "generation (max)",
  count(*) AS cells
FROM cell c
JOIN sweep s ON s.id = c.sweep_id
WHERE {_IN_RANGE}
  AND c.status IN ('ok', 'failed')
GROUP BY 1
ORDER BY 1"""

# What a cell cost: its server's start-up and generation time on each device it held
# (farm.records.CellResult.device_s: a CPU host, and a cell stored before NPU counts,
# as one device).
_DEVICE_S = """(coalesce(c.startup_s, 0) + coalesce(c.generation_s, 0))
    * CASE WHEN coalesce(c.npus, 0) > 1 THEN c.npus ELSE 1 END"""

DEVICE_HOURS_BY_SWEEP = f"""SELECT s.started_at AS "time", s.job AS metric,
  (sum({_DEVICE_S}) / 3600.0)::float8 AS "device hours"
FROM cell c
JOIN sweep s ON s.id = c.sweep_id
WHERE {_IN_RANGE}
GROUP BY s.id, s.started_at, s.job
ORDER BY 1, 2"""

DEVICE_HOURS_BY_VERDICT = f"""WITH cost AS (
  SELECT c.sweep_id, sum({_DEVICE_S}) / 3600.0 AS hours
  FROM cell c
  JOIN sweep s ON s.id = c.sweep_id
  WHERE {_IN_RANGE}
  GROUP BY c.sweep_id
)
SELECT v.kind AS verdicts, count(*) AS "count",
  sum(cost.hours)::float8 AS "device hours",
  avg(cost.hours)::float8 AS "per verdict",
  (sum(cost.hours) / nullif(sum(CASE WHEN v.outcome = 'regression' THEN 1 ELSE 0 END), 0))::float8
    AS "per regression found"
FROM verdict v
JOIN cost ON cost.sweep_id = v.sweep_id
GROUP BY v.kind
ORDER BY 1"""

STARTUP_BY_NODE = f"""SELECT c.started_at AS "time", coalesce(c.node, 'unknown') AS metric,
  c.startup_s::float8 AS "startup"
FROM cell c
JOIN sweep s ON s.id = c.sweep_id
WHERE {_IN_RANGE}
  AND c.startup_s IS NOT NULL
ORDER BY 1, 2"""

# Alerts name no job; one belongs to the job of the last sweep that showed it.
# Each key's AL over the sweeps in range: how much a night moves on its own (plain sd,
# regressions included: `farm noise` gives the robust figure the thresholds use).
AL_SPREAD = f"""SELECT v.key_label AS key, count(*) AS nights,
  avg(1.0 + m.accepted::float8 / m.drafts) AS "AL",
  stddev_samp(1.0 + m.accepted::float8 / m.drafts)
    / avg(1.0 + m.accepted::float8 / m.drafts) AS "AL sd, relative"
FROM variant_summary m
JOIN variant_run v ON v.id = m.variant_run_id
JOIN cell c ON c.id = v.cell_row_id
JOIN sweep s ON s.id = c.sweep_id
WHERE {_IN_RANGE}
  AND m.drafts > 0
GROUP BY v.key_label
HAVING count(*) >= 2
ORDER BY 4 DESC, 1"""

# The spread each night's verdict stored per key (table ``key_spread``,
# farm.store.spread): the calibration's robust night-to-night sd, over the nights.
_SPREAD_RELATIVE = "(k.al_sd / NULLIF(k.al_mean, 0))::float8"

STORED_SPREAD_BY_SWEEP = f"""SELECT s.started_at AS "time", k.key_label AS metric,
  {_SPREAD_RELATIVE} AS "AL sd, relative"
FROM key_spread k
JOIN sweep s ON s.id = k.sweep_id
WHERE {_IN_RANGE}
ORDER BY 1, 2"""

LATEST_STORED_SPREAD = f"""SELECT * FROM (
  SELECT DISTINCT ON (k.job, k.key_label) k.key_label AS key, k.job, k.sweep_id AS sweep,
    k.nights, k.al_mean AS "AL", {_SPREAD_RELATIVE} AS "AL sd, relative",
    k.accuracy_sd AS "accuracy sd", k.flip_rate AS "flip rate",
    k.aa_nights AS "A/A nights", k.aa_false_alarms AS "A/A false alarms"
  FROM key_spread k
  JOIN sweep s ON s.id = k.sweep_id
  WHERE {_IN_RANGE}
  ORDER BY k.job, k.key_label, k.sweep_id DESC
) latest
ORDER BY "AL sd, relative" DESC NULLS LAST, key, job"""

_OPEN_STATES = "('untriaged', 'acknowledged', 'downstream')"

OPEN_ALERTS = f"""SELECT a.id, a.state, a.severity, a.kind, a.metric, a.summary, a.occurrences,
  a.first_sweep_id AS "first sweep", a.last_sweep_id AS "last sweep",
  a.opened_sweep_id AS "opened by sweep", a.updated_at AS updated,
  a.triaged_by AS "triaged by", a.link, s.job
FROM alert a
JOIN sweep s ON s.id = a.last_sweep_id
WHERE a.state IN {_OPEN_STATES}
  AND {_JOB}
ORDER BY CASE a.state WHEN 'untriaged' THEN 0 ELSE 1 END,
  CASE a.severity WHEN 'critical' THEN 0 ELSE 1 END, a.updated_at DESC, a.id DESC"""

OPEN_ALERT_COUNT = f"""SELECT count(*) AS "untriaged alerts"
FROM alert a
JOIN sweep s ON s.id = a.last_sweep_id
WHERE a.state = 'untriaged'
  AND {_JOB}"""

# Open alerts by triage state, whatever their age (they stay until triaged or recovered).
OPEN_ALERTS_BY_STATE = f"""SELECT a.state AS metric, count(*) AS "alerts"
FROM alert a
JOIN sweep s ON s.id = a.last_sweep_id
WHERE a.state IN {_OPEN_STATES}
  AND {_JOB}
GROUP BY a.state
ORDER BY a.state"""

# Triage of the alerts opened in the time range: the share a person called invalid
# (false alarms: Perfherder's invalid-alert rate) and the median time to triage.
ALERT_TRIAGE = f"""SELECT count(*) FILTER (WHERE a.state = 'invalid')::float8
    / nullif(count(*) FILTER (WHERE a.triaged_at IS NOT NULL), 0) AS "invalid-alert rate",
  percentile_cont(0.5) WITHIN GROUP (
    ORDER BY extract(epoch FROM a.triaged_at - a.created_at)
  ) FILTER (WHERE a.triaged_at IS NOT NULL) / 3600.0 AS "median hours to triage",
  count(*) FILTER (WHERE a.triaged_at IS NOT NULL) AS "triaged"
FROM alert a
JOIN sweep s ON s.id = a.opened_sweep_id
WHERE {_IN_RANGE}"""

LATEST_FAILED_CELLS = f"""WITH {_LATEST}
SELECT count(c.id) AS "failed cells in latest sweep"
FROM latest l
JOIN cell c ON c.sweep_id = l.sweep_id
WHERE c.status IN ('failed', 'build_failed')"""

# --- variables ------------------------------------------------------------------------
# Values of the sweeps in the time range only (the variables refresh when it changes).

# Most recently run job first, so the dashboard opens on it.
VARIABLE_JOB_LATEST_FIRST = """SELECT s.job FROM sweep s
WHERE $__timeFilter(s.started_at)
GROUP BY s.job
ORDER BY max(s.id) DESC"""
VARIABLE_JOBS = """SELECT DISTINCT s.job FROM sweep s
WHERE $__timeFilter(s.started_at)
ORDER BY 1"""


def _cell_values(column: str) -> str:
    return (
        f"SELECT DISTINCT {column} FROM cell c JOIN sweep s ON s.id = c.sweep_id\n"
        f"WHERE {_IN_RANGE}\nORDER BY 1"
    )


VARIABLE_ENGINE = _cell_values("c.engine")
VARIABLE_MODEL = _cell_values("c.model")
VARIABLE_GRAPH_MODE = _cell_values("c.planned_graph_mode")
VARIABLE_MTP_DEPTH = f"""SELECT depth::text FROM (
  SELECT DISTINCT c.mtp_depth AS depth FROM cell c JOIN sweep s ON s.id = c.sweep_id
  WHERE {_IN_RANGE}
) d
ORDER BY depth"""
# From the plan stored on each cell, so values of cells that failed are offered too.
# Nights repeat the same plans: each distinct plan text is parsed once, not once a cell.
VARIABLE_THINKING = f"""SELECT DISTINCT e->'axes'->>'thinking' AS thinking
FROM (
  SELECT DISTINCT c.variants::text AS variants
  FROM cell c
  JOIN sweep s ON s.id = c.sweep_id
  WHERE {_IN_RANGE}
) plans
CROSS JOIN LATERAL json_array_elements(plans.variants::json) e
ORDER BY 1"""

# --- alert rules (no variables, no macros) ---------------------------------------------

# One row (an alert instance) per severity with untriaged alerts; the column is not called
# "severity", which is the rule's own label.
ALERT_OPEN_ALERTS = """SELECT severity AS farm_severity, count(*)::float8 AS open_alerts
FROM alert
WHERE state = 'untriaged'
GROUP BY severity
ORDER BY severity"""

# One row per job that ran in the last ALERT_WINDOW_DAYS days: failed or build_failed
# cells of its newest sweep (0 included, so an instance resolves when the next sweep is
# clean).
ALERT_FAILED_CELLS = f"""SELECT s.job,
  (count(c.id) FILTER (WHERE c.status IN ('failed', 'build_failed')))::float8 AS failed_cells
FROM sweep s
LEFT JOIN cell c ON c.sweep_id = s.id
WHERE s.id IN (
  SELECT max(id) FROM sweep
  WHERE started_at > now() - interval '{ALERT_WINDOW_DAYS} days'
  GROUP BY job
)
GROUP BY s.job
ORDER BY s.job"""
