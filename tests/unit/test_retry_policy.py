import pytest

from workflow_engine.definitions import RetryPolicy


def test_defaults_follow_cloudflare():
    policy = RetryPolicy()
    assert (policy.limit, policy.delay, policy.backoff) == (5, 10.0, "exponential")


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [("constant", [2, 2, 2]), ("linear", [2, 4, 6]), ("exponential", [2, 4, 8])],
)
def test_backoff_shapes(backoff, expected):
    policy = RetryPolicy(delay=2, backoff=backoff)
    assert [policy.delay_for(ValueError(), n) for n in (1, 2, 3)] == expected


def test_max_delay_caps():
    assert RetryPolicy(delay=10, max_delay=15).delay_for(ValueError(), 5) == 15


def test_delay_from_error():
    class RateLimited(Exception):
        retry_after = 42.0

    policy = RetryPolicy(delay_fn=lambda e, n: getattr(e, "retry_after", None))
    assert policy.delay_for(RateLimited(), 1) == 42.0
    assert policy.delay_for(ValueError(), 1) == 10.0  # None falls back to the policy
