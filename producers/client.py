"""A small Python client for posting jobs to the ingest service."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class JobResult:
    """What :meth:`IngestClient.submit_and_wait` learnt: ``done`` with the instance's
    ``status`` (``complete``, ``errored``, ``terminated``, ``skipped``, ``debounced``),
    ``result`` and ``error``;
    or not ``done`` within the wait, and then ``location`` to ask again
    (:meth:`IngestClient.result`). ``body`` is the answer as ingest gave it."""

    job_id: str
    done: bool
    status: str | None = None
    result: Any = None
    error: str | None = None
    location: str | None = None
    body: Any = None
    #: The job id's run the answer is about (id reuse: README, Flow control).
    run: int = 1

    @classmethod
    def of(cls, job_id: str, response: httpx.Response) -> JobResult:
        body = response.json()
        if response.status_code == 200:
            return cls(
                job_id,
                True,
                body["status"],
                body.get("result"),
                body.get("error"),
                None,
                body,
                body.get("run", 1),
            )
        location = response.headers.get("Location", f"/v1/jobs/{job_id}")
        return cls(job_id, False, body.get("status"), location=location, body=body)


class IngestClient:
    """``IngestClient("http://127.0.0.1:8080").submit([{"workflow": ..., "params": ...}])``.

    ``submit`` retries a 503 (Kafka not acknowledging) after its ``Retry-After``, up to
    ``retries`` times: resubmitting is safe because a job id never makes two workflows
    at once (under an id reuse policy, a resubmission that lands after its run failed
    starts the next run, as the policy asks).
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

    def submit_and_wait(self, job: dict[str, Any], wait: int = 30) -> JobResult:
        """Submit one job and wait up to ``wait`` seconds (``Prefer: wait``; the server
        caps it to its ``ONCEFLOW_INGEST_MAX_WAIT_SECONDS``) for its instance to finish.
        A job not finished by then is not lost: it is in Kafka (the server answered
        202), and :meth:`result` asks again. Retries a 503 like :meth:`submit`."""
        from onceflow.ids import new_job_id

        job = {**job, "job_id": job.get("job_id") or new_job_id()}
        headers = {"Prefer": f"wait={int(wait)}"}
        for attempt in range(self.retries + 1):
            response = self._http.post(
                "/v1/jobs", json=job, headers=headers, timeout=self._timeout_for(wait)
            )
            if response.status_code in (200, 202):
                return JobResult.of(job["job_id"], response)
            if response.status_code == 503 and attempt < self.retries:
                time.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            raise SubmitError(response.status_code, _json_or_text(response))
        raise AssertionError("unreachable")

    def result(self, job_id: str, wait: float = 30) -> JobResult:
        """The job's outcome, waiting up to ``wait`` seconds for it
        (``GET /v1/jobs/{job_id}/result``); SubmitError on 404 (no instance yet, or an
        unknown id) and the other refusals."""
        response = self._http.get(
            f"/v1/jobs/{job_id}/result", params={"wait": wait}, timeout=self._timeout_for(wait)
        )
        if response.status_code in (200, 202):
            return JobResult.of(job_id, response)
        raise SubmitError(response.status_code, _json_or_text(response))

    def _timeout_for(self, wait: float) -> httpx.Timeout:
        """The client's timeout, with reading the answer allowed the wait on top."""
        base = self._http.timeout
        return httpx.Timeout(
            base.connect, read=(base.read or 0) + wait, write=base.write, pool=base.pool
        )

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
