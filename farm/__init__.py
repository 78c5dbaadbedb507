"""mtp-farm: a regression farm for speculative decoding (MTP) on LLM inference engines.

Where things live: one package per pipeline stage (``spec``, ``builds``, ``engines``,
``workload``, ``runner``, ``orchestrate``, ``store``, ``analysis``, ``results``,
``report``, ``notify``, ``dashboards``, ``workflows``, ``cli``); at the top level only
what every stage shares: the data model (``axes``, ``comparable``, ``plan``,
``records``), the base (``errors``, ``frozen``, ``settings``, ``paths``), the file
boundary (``yamlfile``, ``fileformat``) and the checks of outside input (``bounds``,
``inert``, ``masking``, ``job_text``). ``tests/unit/test_layers.py`` holds each to its
floor.

Result types, from what a sweep measured to what a team reads (module in brackets):

What a sweep measured (``farm.records``; the runner makes them, the store keeps them):

- ``RequestRecord``: one request of a variant: what was asked and answered, its time.
- ``VariantResult``: one request-level variant (thinking, workload) of a cell: its
  counters and requests.
- ``CellResult``: one server cell's outcome: its variant results, or why it failed.
- ``ConfirmationRun``: one rerun of a suspicious cell in its night or PR run, by the
  candidate's build or the reference's (the last good night's, or the PR's base).
- ``StoredCell``: a planned cell as stored, with its ``CellResult`` when it has one.
- ``SweepRecord``: a sweep read back from the store (cells, builds, reruns): what
  reports and analyses read.

What the analysis makes of a sweep (``farm.analysis``, pure):

- ``VariantSummary`` (``summary.summarize_sweep``): one row of the sweep matrix.
- ``CheckVerdict`` (``check_rules``): one within-sweep comparison (graph mode vs eager,
  patch vs base, depth invariance), judged; ``Note``: one that could not be made.
- ``CheckReport`` (``checks.check_sweep``): a sweep's ``CheckVerdict``s and ``Note``s.
- ``ComparedVariant`` (``compare``): one comparable key in a baseline and a candidate
  sweep: the AL of each and their difference, judged.
- ``SweepComparison`` (``compare.compare_sweeps``): every key of two sweeps, as
  ``ComparedVariant`` rows.
- ``HistoryFigures`` (``history``): one variant's AL as history reads it (the store
  keeps one per variant); ``HistoryPoint``: one sweep's AL in a key's series.
- ``HistoryAnalysis`` (``history.analyze_history``): the ``ChangePoint``s of one
  key's series.
- ``Confirmation`` (``confirm.decide``): a suspicious cell decided from its
  ``ConfirmationRun``s, with runs as the unit.
- ``Judgement`` (``judgement.judge``): one sweep judged, the value every use reads:
  its ``Finding``s and what they came from (``CheckReport``, ``SweepComparison``,
  ``HistoryAnalysis``).

What is stored and shown (``farm.results``):

- ``Finding`` (``verdict``): one reason for a verdict: what was found on which
  comparable key, in which cells, with its figures; the one finding type of every use.
- ``SweepVerdict`` (``verdict``, from ``Judgement.verdict``): the verdict on one sweep
  (nightly, PR or A/A night): its outcome and ``Finding``s.
- ``AlertCandidate`` (``alerts``, from ``analysis.alert_rules.alert_candidates``): an
  alert a ``Judgement``'s findings propose, before the store deduplicates it.
- ``AlertRecord`` (``alerts``): a stored alert: its triage state and the sweeps that
  showed it.
- ``Bisection`` (``bisection``): a stored bisection: the commits searched, both ends,
  the ``BisectStep``s so far and the answer.
- ``VariantFigures`` (``bisection``): one regressed variant at one commit: AL with its
  interval, acceptance per draft position; ``VariantJudgement``: the same at a step,
  compared with both ends.

What each daily use returns (``farm.workflows``):

- ``NightJudgement`` (``nightly.decide.judge_night``): a night's ``Judgement``, its
  ``SweepVerdict`` and ``AlertCandidate``s; ``NightlyCheck``: what checking it did
  (alerts raised, recovered, withdrawn, sent); ``NightlyOutcome``: that and the pages.
- ``PrJudgement`` (``pr.decide.judge_pr``): a PR's ``SweepVerdict`` and
  ``SweepComparison``; ``PrOutcome``: its check, report, comment and commit status.
- ``BisectOutcome`` (``bisect.run``): a bisection run and whether every channel took
  its answer.
- ``CompareOutcome`` (``compare.run``): ``farm compare``'s ``SweepComparison`` and its
  Markdown.
- ``AlertCheck`` (``alerts.steps``): what one ``farm alerts check`` pass did.
- ``SelftestReport`` (``selftest.decide.analyze_selftest``): the self-test sweep's
  ``CheckReport`` and, per engine (each canary, the clean repeat), where it differs
  from the clean reference.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
