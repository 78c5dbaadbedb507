"""Ray Jobs: submit a driver command to a cluster's job server, follow it, stop it.

A thin typed wrapper of ``ray.job_submission.JobSubmissionClient``
(https://docs.ray.io/en/latest/cluster/running-applications/job-submission/sdk.html),
which talks to the head's dashboard (port 8265). A cluster with token
authentication (Ray >= 2.52) gets the token from ``RAY_AUTH_TOKEN`` as a bearer
header.

Every request has a timeout (``FARM_RAY_CLIENT_TIMEOUT_S``): the SDK sends its
requests without one, so a head that accepts the connection and never answers would
hold `farm submit` for good. A timeout, a refused connection or a refused request
raises :class:`SubmitError` naming the address and the request.
"""

from __future__ import annotations

import time
from typing import Any

import requests
from ray.job_submission import JobSubmissionClient

from farm.errors import FarmError
from farm.masking import mask_secrets
from farm.settings import get_settings

__all__ = ["JobServer", "SubmitError"]

_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class SubmitError(FarmError):
    """The job server refused a request, cannot be reached or did not answer in time."""


class _TimedClient(JobSubmissionClient):
    """The SDK client with a timeout on each request.

    Every SDK call goes through ``_do_request`` (ray 2.60,
    ``ray/dashboard/modules/dashboard_sdk.py``), which passes extra keyword arguments
    on to ``requests.request``; ray is pinned, and a test runs this against a real head.
    """

    def __init__(self, address: str, timeout_s: float, **kwargs: Any) -> None:
        self._farm_timeout_s = timeout_s  # set first: the constructor already asks the head
        super().__init__(address, **kwargs)

    def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", self._farm_timeout_s)
        try:
            return super()._do_request(method, endpoint, **kwargs)
        except requests.Timeout:
            raise SubmitError(
                f"the Ray job server at {mask_secrets(self._address)} did not answer "
                f"{method} {endpoint} "
                f"within {self._farm_timeout_s:g} s (FARM_RAY_CLIENT_TIMEOUT_S); is the head "
                "overloaded or the network partitioned?"
            ) from None


class JobServer:
    """The job server of one Ray cluster, at its dashboard ``address``.

    Constructing one asks the server for its version (so a wrong address or token
    fails here); every method raises SubmitError rather than the SDK's own errors.
    """

    def __init__(self, address: str, timeout_s: float | None = None) -> None:
        settings = get_settings().ray
        token = settings.auth_token
        headers = {"Authorization": f"Bearer {token.get_secret_value()}"} if token else None
        self.address = address
        self.timeout_s = timeout_s or settings.client_timeout_s
        try:
            self._client = _TimedClient(address, self.timeout_s, headers=headers)
        except SubmitError:
            raise
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, AuthenticationError
            raise SubmitError(
                f"cannot reach the Ray job server at {mask_secrets(address)}: "
                f"{mask_secrets(str(exc))}"
            ) from exc

    def _call(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except SubmitError:
            raise
        except (RuntimeError, ConnectionError, requests.RequestException) as exc:
            raise SubmitError(
                f"the job server at {mask_secrets(self.address)} could not {what}: "
                f"{mask_secrets(str(exc))}"
            ) from exc

    def submit(self, entrypoint: str, runtime_env: dict[str, Any], metadata: dict[str, str]) -> str:
        """Submit ``entrypoint``; return the job's submission id."""
        return str(
            self._call(
                "take the job",
                self._client.submit_job,
                entrypoint=entrypoint,
                runtime_env=runtime_env,
                metadata=metadata,
            )
        )

    def status(self, job_id: str) -> str:
        """PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
        found = self._call(f"tell job {job_id}'s status", self._client.get_job_status, job_id)
        return str(found.value)

    def logs(self, job_id: str) -> str:
        """Everything job ``job_id`` has printed so far."""
        return str(self._call(f"send job {job_id}'s logs", self._client.get_job_logs, job_id))

    def stop(self, job_id: str) -> bool:
        """Ask the server to stop job ``job_id``; False when it had already ended."""
        return bool(self._call(f"stop job {job_id}", self._client.stop_job, job_id))

    def wait(self, job_id: str, poll_s: float = 2.0) -> str:
        """Block until the job ends; return its final status. Each poll is one request
        with the client's timeout; the job itself may run as long as it needs."""
        while (state := self.status(job_id)) not in _TERMINAL:
            time.sleep(poll_s)
        return state
