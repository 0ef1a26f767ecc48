"""Webhook endpoints: the allow-list, the event kinds, and the address rules (SSRF).

Pure values and checks, no I/O: the settings parse ``ONCEFLOW_WEBHOOK_ENDPOINTS`` into
:class:`WebhookEndpoint` values, ingest and the worker check a job's ``callback``
against their names (:func:`callback_problem`), the definitions check a workflow's
subscriptions, and the dispatcher asks :func:`address_refusal` about every address a
target's host resolves to, at delivery time, before it connects (README, "Webhooks";
docs/operations.md, "Webhooks").

A target is never a URL from a request: a job names an endpoint, and only the
configuration says where that endpoint is.
"""

from __future__ import annotations

import base64
import ipaddress
import re
from collections.abc import Iterable
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from onceflow.vocabulary import FINAL_EVENTS, LifecycleEvent

#: Every lifecycle event kind (the events contract of issue 25; the topic's ``ce_type`` is
#: ``dev.onceflow.<kind>``): the vocabulary's, as plain strings.
EVENT_KINDS: tuple[str, ...] = tuple(str(kind) for kind in LifecycleEvent)
#: The final kinds, a start-and-wait caller's answer: what a subscription gets when
#: neither it nor its endpoint names kinds.
FINAL_KINDS: tuple[str, ...] = tuple(str(k) for k in LifecycleEvent if k in FINAL_EVENTS)

#: An endpoint's name: what a job's ``callback`` and ``@workflow(webhooks=...)`` say.
ENDPOINT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_ENDPOINT_NAME_RE = re.compile(ENDPOINT_NAME_PATTERN)
_SECRET_PREFIX = "whsec_"
#: The shortest secret accepted (decoded bytes): Standard Webhooks asks for 24 to 64.
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64


def check_kinds(kinds: Iterable[str], where: str) -> tuple[str, ...]:
    """``kinds`` as a tuple if each is a known event kind, else ValueError naming it."""
    given = tuple(kinds)
    for kind in given:
        if kind not in EVENT_KINDS:
            raise ValueError(
                f"{where}: unknown event kind {str(kind)[:60]!r} (one of {', '.join(EVENT_KINDS)})"
            )
    if not given:
        raise ValueError(f"{where}: an empty list of event kinds would deliver nothing")
    return given


def secret_bytes(secret: str) -> bytes:
    """The key of a ``whsec_<base64>`` secret, or ValueError saying what is wrong."""
    if not secret.startswith(_SECRET_PREFIX):
        raise ValueError("a webhook secret is 'whsec_' followed by base64 (Standard Webhooks)")
    try:
        key = base64.b64decode(secret[len(_SECRET_PREFIX) :], validate=True)
    except ValueError:
        raise ValueError("the webhook secret after 'whsec_' is not valid base64") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(
            f"the webhook secret is {len(key)} bytes; use {MIN_SECRET_BYTES} to"
            f" {MAX_SECRET_BYTES} random bytes (`onceflow webhooks secret` makes one)"
        )
    return key


class WebhookEndpoint(BaseModel):
    """One named target in ``ONCEFLOW_WEBHOOK_ENDPOINTS``.

    ``kinds``: what a subscription to it gets unless the subscription names its own
    (default: the final kinds). ``allow_private``: deliver even to private, loopback
    and link-local addresses; ``allowed_cidrs``: only those networks, as an exception
    to the address rules (an internal receiver in 10.20.0.0/16, say).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(max_length=2000)
    secret: str = Field(repr=False)
    kinds: tuple[str, ...] = FINAL_KINDS
    allow_private: bool = False
    allowed_cidrs: tuple[str, ...] = ()

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError("a webhook url is http:// or https://")
        if not parts.hostname:
            raise ValueError("a webhook url names a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("a webhook url carries no credentials (the signature is the proof)")
        if parts.fragment:
            raise ValueError("a webhook url has no #fragment")
        try:
            parts.port  # noqa: B018 - raises on a port out of range
        except ValueError as exc:
            raise ValueError(f"a webhook url's port is invalid: {exc}") from None
        return url

    @field_validator("secret")
    @classmethod
    def _secret(cls, secret: str) -> str:
        secret_bytes(secret)
        return secret

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, kinds: tuple[str, ...]) -> tuple[str, ...]:
        return check_kinds(kinds, "kinds")

    @field_validator("allowed_cidrs")
    @classmethod
    def _cidrs(cls, cidrs: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in cidrs:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"allowed_cidrs: {cidr[:60]!r} is not a network") from None
        return cidrs

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)


EndpointName = Annotated[str, Field(pattern=ENDPOINT_NAME_PATTERN)]


def callback_problem(callback: Any, known: Iterable[str] | None) -> tuple[str, str] | None:
    """Why ``callback`` cannot be a job's callback, as (code, text), or None if it can.

    ``invalid_callback``: not an endpoint name at all; ``unknown_callback``: a name no
    configured endpoint has (``known``; None: not checked here)."""
    if not isinstance(callback, str) or not _ENDPOINT_NAME_RE.fullmatch(callback):
        return (
            "invalid_callback",
            f"callback {str(callback)[:80]!r} is not an endpoint name (letters, digits,"
            " '_', '.', '-'; at most 64): a callback names a configured endpoint, never a URL",
        )
    if known is not None:
        names = sorted(known)
        if callback not in names:
            return (
                "unknown_callback",
                f"callback {callback!r} names no configured webhook endpoint"
                f" (configured: {', '.join(names) or 'none'}; ONCEFLOW_WEBHOOK_ENDPOINTS)",
            )
    return None


# --- addresses (SSRF) -----------------------------------------------------------------

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: NAT64's well-known prefix (RFC 6052: the IPv4 address in the last 32 bits) and its
#: local-use prefix (RFC 8215). Python's ipaddress has called the first private or
#: global depending on its patch release: it is judged here by the address it carries.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")


def _kind_of(ip: IPAddress) -> str | None:
    """What makes ``ip`` a refused target (unspecified, loopback, link-local, multicast,
    private, reserved), or None for a public address."""
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv6Address) and (ip.is_site_local or ip in _NAT64_LOCAL):
        return "private"
    # is_private covers RFC 1918, 100.64/10 shared space, fc00::/7, and the special
    # ranges Python lists (documentation, benchmarking, 192.0.0.0/24...).
    if ip.is_private or ip.is_reserved or not ip.is_global:
        return "private"
    return None


def _carried_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a 6to4 (2002::/16) or NAT64 address reaches through its gateway."""
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_refusal(address: str | IPAddress, endpoint: WebhookEndpoint) -> str | None:
    """Why the dispatcher must not connect to ``address`` for ``endpoint``, or None.

    An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) is judged as its IPv4 address; a
    6to4 or NAT64 address is refused when the IPv4 address it carries would be.
    ``allow_private`` lets every address through; ``allowed_cidrs`` lets those networks
    through whatever their kind."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    carried = _carried_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
    if carried is not None and _kind_of(carried) is not None:
        ip = carried
    kind = _kind_of(ip)
    if kind is None or endpoint.allow_private:
        return None
    for cidr in endpoint.allowed_cidrs:
        network = ipaddress.ip_network(cidr, strict=False)
        if ip.version == network.version and ip in network:
            return None
    return (
        f"{ip} is a {kind} address; the endpoint allows it only with allow_private"
        " or an allowed_cidrs entry"
    )
