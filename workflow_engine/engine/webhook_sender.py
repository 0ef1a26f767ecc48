"""One webhook attempt: a signed POST to a configured endpoint, and nowhere else.

* **Signed** per Standard Webhooks with the ``standardwebhooks`` package: headers
  ``webhook-id`` (the event id, the same on every attempt: the receiver's dedupe key),
  ``webhook-timestamp`` (this attempt's time), ``webhook-signature`` (``v1,<base64
  HMAC-SHA256 of "id.timestamp.body">``).
* **SSRF**: the connection is made by :class:`GuardedBackend`, httpcore's network backend
  for this endpoint's client. It resolves the host itself at connect time, refuses the
  connection (:class:`RefusedAddress`) unless every address the name resolves to is
  allowed (:func:`onceflow.webhooks.address_refusal`), connects to the address it
  checked (not to the name again: no DNS rebinding between the check and the connect),
  and checks the connected socket's peer address once more. TLS still verifies the
  certificate against the host name (httpcore passes it as the server name).
* **No redirects** (httpx's default, stated), no proxies from the environment
  (``trust_env=False``: a proxy would connect for us, past the guard).
* **Bounded**: connect / read / write timeouts, a total per attempt, and at most
  :data:`MAX_RESPONSE_BYTES` of the answer read (then the connection is closed).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import httpcore
import httpx
from standardwebhooks import Webhook

from onceflow.vocabulary import WebhookDeadReason, WebhookOutcome
from onceflow.webhooks import WebhookEndpoint, address_refusal
from workflow_engine.store.writes import AttemptResult

#: The most of a receiver's answer read; the rest is never read.
MAX_RESPONSE_BYTES = 64 * 1024
USER_AGENT = "onceflow-webhooks/1"


class RefusedAddress(Exception):
    """The endpoint's host resolves to an address it may not reach."""


@dataclass(frozen=True, slots=True)
class SenderConfig:
    connect_timeout: float
    read_timeout: float
    attempt_timeout: float


async def _resolve(host: str, port: int, timeout: float | None) -> list[str]:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except TimeoutError:
        raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
    except OSError as exc:
        raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, resolving and checking every address itself."""

    def __init__(self, endpoint: WebhookEndpoint) -> None:
        self.endpoint = endpoint
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await _resolve(host, port, timeout)
        for address in addresses:
            refusal = address_refusal(address, self.endpoint)
            if refusal is not None:
                raise RefusedAddress(f"{host} resolves to {refusal}")
        failure: Exception = httpcore.ConnectError(f"{host} resolves to no address")
        for address in addresses:
            try:
                stream = await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
                continue
            peer = stream.get_extra_info("server_addr")
            refusal = address_refusal(peer[0], self.endpoint) if peer else "no peer address"
            if refusal is not None:
                await stream.aclose()
                raise RefusedAddress(f"{host} connected to {refusal}")
            return stream
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise RefusedAddress("a webhook target is never a unix socket")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport with its connection pool on a :class:`GuardedBackend`.

    httpx takes no network backend, so the pool it built is replaced by one that has
    the same settings and this backend (httpx 0.28: ``_pool``; the integration tests
    prove a refused address is never connected to, so a change there cannot pass
    silently)."""

    def __init__(self, endpoint: WebhookEndpoint, max_connections: int) -> None:
        super().__init__(trust_env=False, retries=0)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=5.0,
            retries=0,
            network_backend=GuardedBackend(endpoint),
        )


class WebhookSender:
    """One HTTP client per endpoint; :meth:`send` makes one attempt."""

    def __init__(
        self, endpoints: dict[str, WebhookEndpoint], config: SenderConfig, concurrency: int
    ) -> None:
        self.endpoints = endpoints
        self.config = config
        timeout = httpx.Timeout(
            connect=config.connect_timeout,
            read=config.read_timeout,
            write=config.read_timeout,
            pool=config.attempt_timeout,
        )
        self._clients = {
            name: httpx.AsyncClient(
                transport=_GuardedTransport(endpoint, concurrency),
                timeout=timeout,
                follow_redirects=False,
                trust_env=False,
                headers={"user-agent": USER_AGENT, "content-type": "application/json"},
            )
            for name, endpoint in endpoints.items()
        }
        self._signers = {name: Webhook(e.secret) for name, e in endpoints.items()}

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    def signed_headers(self, endpoint: str, event_id: str, body: str) -> dict[str, str]:
        now = datetime.now(UTC)
        return {
            "webhook-id": event_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": self._signers[endpoint].sign(event_id, now, body),
        }

    async def send(self, endpoint: str, event_id: str, body: str) -> AttemptResult:
        """One attempt; never raises for what the receiver or the network did."""
        client = self._clients.get(endpoint)
        if client is None:
            return AttemptResult(
                WebhookOutcome.REFUSED,
                error=f"endpoint {endpoint!r} is not configured",
                dead_reason=WebhookDeadReason.UNKNOWN_ENDPOINT,
            )
        url = self.endpoints[endpoint].url
        headers = self.signed_headers(endpoint, event_id, body)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.config.attempt_timeout):
                code = await _post(client, url, body, headers)
        except RefusedAddress as exc:
            return AttemptResult(
                WebhookOutcome.REFUSED,
                _ms(started),
                error=str(exc),
                dead_reason=WebhookDeadReason.REFUSED_ADDRESS,
            )
        except (TimeoutError, httpx.TimeoutException):
            error = f"timed out (attempt limit {self.config.attempt_timeout:g} s)"
            return AttemptResult(WebhookOutcome.FAILED, _ms(started), error=error)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return AttemptResult(WebhookOutcome.FAILED, _ms(started), error=error)
        if 200 <= code < 300:
            return AttemptResult(WebhookOutcome.DELIVERED, _ms(started), code)
        redirect = "redirect not followed" if 300 <= code < 400 else None
        return AttemptResult(WebhookOutcome.FAILED, _ms(started), code, redirect)


async def _post(client: httpx.AsyncClient, url: str, body: str, headers: dict[str, str]) -> int:
    """POST ``body``; the status code, once at most :data:`MAX_RESPONSE_BYTES` of the
    answer are read (the connection is closed on a longer one)."""
    async with client.stream("POST", url, content=body.encode(), headers=headers) as response:
        read = 0
        async for chunk in response.aiter_raw():
            read += len(chunk)
            if read >= MAX_RESPONSE_BYTES:
                break
        return response.status_code


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0
