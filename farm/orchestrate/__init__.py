"""Placement of cells on a Ray cluster: the only package that imports ray.

By concern: :mod:`~farm.orchestrate.placement` (where a cell may run),
:mod:`~farm.orchestrate.node_builds` (builds on the nodes),
:mod:`~farm.orchestrate.dispatch` (cells handed to Ray in the driver's order),
:mod:`~farm.orchestrate.host_cluster` (this host's own cluster),
:mod:`~farm.orchestrate.ray_pool` (the pool that ties them together) and
:mod:`~farm.orchestrate.driver` (one sweep: plan, builds, cells, store). Two modules
import no Ray, so tools and tests without a cluster use them:
:mod:`~farm.orchestrate.schedule` (the order cells are dispatched in: longest first,
best fit, and its simulation) and :mod:`~farm.orchestrate.log_retention` (which engine
logs and Ray session folders ``farm logs gc`` may remove).

The package itself imports nothing, so that importing one of those two pulls in no Ray;
import each name from its module.
"""
