"""Ray Jobs: submit a driver command to a cluster's job server, follow it, stop it.

A thin typed wrapper of ``ray.job_submission.JobSubmissionClient``
(https://docs.ray.io/en/latest/cluster/running-applications/job-submission/sdk.html),
which talks to the head's dashboard (port 8265). A cluster with token
authentication (Ray >= 2.52) gets the token from ``RAY_AUTH_TOKEN`` as a bearer
header.
"""

from __future__ import annotations

import time
from typing import Any

from ray.job_submission import JobSubmissionClient

from farm.errors import FarmError
from farm.settings import get_settings

__all__ = ["JobServer", "SubmitError"]

_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class SubmitError(FarmError):
    """The job server refused a request or cannot be reached."""


class JobServer:
    """The job server of one Ray cluster, at its dashboard ``address``."""

    def __init__(self, address: str) -> None:
        token = get_settings().ray.auth_token
        headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else None
        self.address = address
        try:
            self._client = JobSubmissionClient(address, headers=headers)
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, AuthenticationError
            raise SubmitError(f"cannot reach the Ray job server at {address}: {exc}") from exc

    def submit(self, entrypoint: str, runtime_env: dict[str, Any], metadata: dict[str, str]) -> str:
        """Submit ``entrypoint``; return the job's submission id."""
        try:
            return str(
                self._client.submit_job(
                    entrypoint=entrypoint, runtime_env=runtime_env, metadata=metadata
                )
            )
        except RuntimeError as exc:
            raise SubmitError(f"the job server at {self.address} refused the job: {exc}") from exc

    def status(self, job_id: str) -> str:
        """PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
        return str(self._client.get_job_status(job_id).value)

    def logs(self, job_id: str) -> str:
        return str(self._client.get_job_logs(job_id))

    def stop(self, job_id: str) -> bool:
        return bool(self._client.stop_job(job_id))

    def wait(self, job_id: str, poll_s: float = 2.0) -> str:
        """Block until the job ends; return its final status."""
        while (state := self.status(job_id)) not in _TERMINAL:
            time.sleep(poll_s)
        return state
