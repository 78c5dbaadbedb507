"""Workflows: the farm's daily uses (a nightly, a pull request) as one pure decision
each over what the store holds. The commands in :mod:`farm.cli` do the I/O around them.

- :mod:`farm.results.verdict`: the typed verdict of a nightly or PR run (stored by
  :mod:`farm.store.verdicts`, shown by reports and ``farm sweeps``).
- :mod:`farm.workflows.nightly.decide`: the nightly's decision: within-sweep checks, the
  paired comparison with the job's last good night, history checks.
- :mod:`farm.workflows.nightly.steps`: the I/O around it (store, alerts, notifications,
  the published report folder); imported by the commands, never by the pure parts.
"""
