"""Workloads: prompt sets, generators and scorers for the farm's requests."""
