"""Workflows: the farm's daily uses, one subpackage each, the same shape for all.

- ``nightly/``, ``pr/``, ``bisect/``, ``compare/``, ``alerts/`` (``farm alerts check``);
  in each, ``run.py`` holds the request, its dependencies and ``run_<use>(request,
  deps)``; ``decide.py`` the pure decision (a verdict, a search), where the use has
  one; ``steps.py`` the I/O steps (store, alerts, notifications, pages), where it has
  them. ``bisect/setup.py``, ``bisect/ends.py``, ``pr/order.py`` and
  ``nightly/spread.py`` are steps of their own.
- ``selftest/`` (``farm selftest``): ``decide.py`` judges the self-test sweep.
- :mod:`farm.workflows.common`: a store session, running a sweep a verdict reads
  (its display handed in), the resume check, the GitHub client, writing a page.

The commands in :mod:`farm.cli` build the request, hand the display callbacks as
dependencies, call ``run_<use>`` and print its outcome. :mod:`farm.results.verdict` is
the typed verdict they store (:mod:`farm.store.verdicts`).
"""
