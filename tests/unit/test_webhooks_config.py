"""Webhook endpoints: the configuration's checks, a job's callback, and which addresses
a delivery may reach (SSRF)."""

from __future__ import annotations

import base64
import json

import pytest
from pydantic import ValidationError

from onceflow.settings import Settings
from onceflow.webhooks import (
    FINAL_KINDS,
    WebhookEndpoint,
    address_refusal,
    callback_problem,
    secret_bytes,
)

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def endpoint(**fields) -> WebhookEndpoint:
    return WebhookEndpoint(**{"url": "https://hooks.example.com/in", "secret": SECRET, **fields})


def test_the_setting_reads_a_named_map_with_defaults(monkeypatch):
    monkeypatch.setenv(
        "ONCEFLOW_WEBHOOK_ENDPOINTS",
        json.dumps(
            {
                "billing": {"url": "https://billing.example.com/hook", "secret": SECRET},
                "audit": {
                    "url": "http://10.0.0.7:8000/h",
                    "secret": SECRET,
                    "kinds": ["step.completed"],
                    "allowed_cidrs": ["10.0.0.0/8"],
                },
            }
        ),
    )
    s = Settings()
    assert s.webhook_endpoints["billing"].kinds == FINAL_KINDS
    assert s.webhook_endpoints["billing"].port == 443
    assert s.webhook_endpoints["audit"].kinds == ("step.completed",)
    assert s.webhook_endpoints["audit"].port == 8000
    assert SECRET not in repr(s.webhook_endpoints)  # never in a log line


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"url": "ftp://example.com/x"}, "http:// or https://"),
        ({"url": "https:///nohost"}, "names a host"),
        ({"url": "https://user:pw@example.com/"}, "no credentials"),
        ({"url": "https://example.com:99999/"}, "port"),
        ({"secret": "s3cret"}, "whsec_"),
        ({"secret": "whsec_!!!not-base64"}, "base64"),
        ({"secret": "whsec_" + base64.b64encode(b"short").decode()}, "24 to 64"),
        ({"kinds": ["instance.finished"]}, "unknown event kind"),
        ({"kinds": []}, "deliver nothing"),
        ({"allowed_cidrs": ["10.0.0.0/33"]}, "not a network"),
        ({"surprise": True}, "Extra inputs"),
    ],
)
def test_a_bad_endpoint_is_refused_with_the_reason(fields, says):
    with pytest.raises(ValidationError) as caught:
        endpoint(**fields)
    assert says in str(caught.value)


def test_a_bad_endpoint_name_is_refused_by_the_settings(monkeypatch):
    monkeypatch.setenv(
        "ONCEFLOW_WEBHOOK_ENDPOINTS",
        json.dumps({"https://evil.example/": {"url": "https://x.example/", "secret": SECRET}}),
    )
    with pytest.raises(ValidationError, match="pattern"):
        Settings()


def test_secret_bytes_decodes_the_standard_webhooks_form():
    assert secret_bytes(SECRET) == b"k" * 32


@pytest.mark.parametrize(
    ("callback", "known", "code"),
    [
        ("billing", {"billing"}, None),
        ("billing", None, None),
        ("billing", set(), "unknown_callback"),
        ("payroll", {"billing"}, "unknown_callback"),
        ("https://evil.example/hook", {"billing"}, "invalid_callback"),
        ("", {"billing"}, "invalid_callback"),
        ("x" * 65, None, "invalid_callback"),
        (42, {"billing"}, "invalid_callback"),
    ],
)
def test_callback_problem(callback, known, code):
    problem = callback_problem(callback, known)
    assert (problem[0] if problem else None) == code


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),  # carrier-grade NAT space
        ("fd00::1", "private"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped: judged as its IPv4 address
        ("::ffff:10.0.0.1", "private"),
        # IPv6 forms that carry an IPv4 address to a gateway: judged by that address
        # too, whatever this Python's ipaddress version thinks of the prefix.
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a00:1::1", "private"),  # 6to4 of 10.0.0.1
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 (RFC 6052) of 127.0.0.1
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("64:ff9b:1::a00:1", "private"),  # NAT64 local-use prefix (RFC 8215)
        ("fec0::1", "private"),  # deprecated site-local
        ("93.184.215.14", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_address_classification(address, kind):
    refusal = address_refusal(address, endpoint())
    if kind is None:
        assert refusal is None
    else:
        assert refusal is not None and f"a {kind} address" in refusal


def test_allow_private_and_allowed_cidrs_are_the_exceptions():
    assert address_refusal("127.0.0.1", endpoint(allow_private=True)) is None
    narrow = endpoint(allowed_cidrs=("10.20.0.0/16",))
    assert address_refusal("10.20.3.4", narrow) is None
    assert address_refusal("10.21.3.4", narrow) is not None
    assert address_refusal("127.0.0.1", narrow) is not None
    assert address_refusal("::ffff:10.20.3.4", narrow) is None
