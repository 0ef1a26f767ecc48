"""A small Python client for posting jobs to the ingest service."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import httpx

from onceflow.errors import OnceflowError


class SubmitError(OnceflowError):
    """A refusal. Every error answer of ingest has one shape (``ErrorBody``): ``error``
    (a code), ``message``, and the ``fields``/``accepted``/``rejected``/``details``
    that apply; a body without it (a proxy's page) is kept as text."""

    def __init__(self, status: int, body: Any) -> None:
        shaped = isinstance(body, dict) and isinstance(body.get("message"), str)
        self.error: str = str(body.get("error", "")) if shaped else ""
        message = body["message"] if shaped else str(body)[:200]
        super().__init__(f"ingest answered {status} {self.error}: {message}".replace(" :", ":"))
        self.status = status
        self.body = body


class IngestClient:
    """``IngestClient("http://127.0.0.1:8080").submit([{"workflow": ..., "params": ...}])``.

    ``submit`` retries a 503 (Kafka not acknowledging) after its ``Retry-After``, up to
    ``retries`` times: resubmitting is safe because a job id never makes two workflows.
    Jobs without an id get one assigned here, so that a retry resubmits the same ids.
    """

    def __init__(
        self, base_url: str, timeout: float = 30.0, retries: int = 5, api_key: str | None = None
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url, timeout=timeout, headers=headers)
        self.retries = retries

    def submit(self, jobs: Iterable[dict[str, Any]]) -> dict[str, Any]:
        from onceflow.ids import new_job_id

        batch = [{**job, "job_id": job.get("job_id") or new_job_id()} for job in jobs]
        for attempt in range(self.retries + 1):
            response = self._http.post("/v1/jobs", json={"jobs": batch})
            if response.status_code == 202:
                return response.json()
            if response.status_code == 503 and attempt < self.retries:
                time.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            raise SubmitError(response.status_code, _json_or_text(response))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> IngestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text
