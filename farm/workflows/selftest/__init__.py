"""`farm selftest`: whether the farm still catches its seed bugs on this machine.

:mod:`~farm.workflows.selftest.decide` is the pure decision: each engine of the
self-test sweep (each canary, the clean repeat) against the clean reference.
"""
