"""Table tests for the failure-reason vocabulary and policy (DESIGN 4.2, 4.4)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_actors.core import reasons as r

ALL_CODES = [
    "runtime_offline", "queued_expired", "delivery_timeout", "agent_blocked", "cancelled",
    "provider_auth_or_access", "provider_quota_limit", "provider_rate_limit", "provider_server_error",
    "context_overflow", "missing_config", "model_unavailable", "unknown", "target_busy", "loop_guard",
]


def test_vocabulary_is_exactly_the_design_list() -> None:
    assert frozenset(ALL_CODES) == r.VOCABULARY
    constants = {
        r.RUNTIME_OFFLINE, r.QUEUED_EXPIRED, r.DELIVERY_TIMEOUT, r.AGENT_BLOCKED, r.CANCELLED,
        r.PROVIDER_AUTH_OR_ACCESS, r.PROVIDER_QUOTA_LIMIT, r.PROVIDER_RATE_LIMIT, r.PROVIDER_SERVER_ERROR,
        r.CONTEXT_OVERFLOW, r.MISSING_CONFIG, r.MODEL_UNAVAILABLE, r.UNKNOWN, r.TARGET_BUSY, r.LOOP_GUARD,
    }
    assert constants == r.VOCABULARY


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # auth
        ("HTTP 401 from provider", "provider_auth_or_access"),
        ("error 403", "provider_auth_or_access"),
        ("Unauthorized", "provider_auth_or_access"),
        ("request FORBIDDEN by policy", "provider_auth_or_access"),
        ("Invalid API key supplied", "provider_auth_or_access"),
        ("invalid_api_key", "provider_auth_or_access"),
        ("invalid-api-key", "provider_auth_or_access"),
        ("Authentication failed", "provider_auth_or_access"),
        ("permission_denied", "provider_auth_or_access"),
        # quota
        ("402", "provider_quota_limit"),
        ("You exceeded your current quota", "provider_quota_limit"),
        ("insufficient_quota", "provider_quota_limit"),
        ("Billing hard limit reached", "provider_quota_limit"),
        ("Your credit balance is too low", "provider_quota_limit"),
        ("payment-required", "provider_quota_limit"),
        # rate
        ("429", "provider_rate_limit"),
        ("Rate limit reached", "provider_rate_limit"),
        ("rate-limit", "provider_rate_limit"),
        ("RATE_LIMIT", "provider_rate_limit"),
        ("rate_limit_exceeded", "provider_rate_limit"),
        ("Too Many Requests", "provider_rate_limit"),
        ("too_many_requests", "provider_rate_limit"),
        # server
        ("500 internal", "provider_server_error"),
        ("upstream returned 502", "provider_server_error"),
        ("(503)", "provider_server_error"),
        ("status=504", "provider_server_error"),
        ("Internal Server Error", "provider_server_error"),
        ("server_error", "provider_server_error"),
        ("Bad Gateway", "provider_server_error"),
        ("service unavailable", "provider_server_error"),
        ("Overloaded", "provider_server_error"),
        # overflow
        ("context length exceeded", "context_overflow"),
        ("context_length_exceeded", "context_overflow"),
        ("exceeds the context window", "context_overflow"),
        ("maximum context length is 8192", "context_overflow"),
        ("too many tokens in request", "context_overflow"),
        ("prompt is too long", "context_overflow"),
        # config
        ("provider not configured", "missing_config"),
        ("missing config for profile", "missing_config"),
        ("missing-config", "missing_config"),
        ("no provider selected", "missing_config"),
        # model
        ("model not found: gpt-9", "model_unavailable"),
        ("unknown model 'x'", "model_unavailable"),
        ("model_unavailable", "model_unavailable"),
        ("The model does not exist", "model_unavailable"),
        # timeout
        ("request timed out", "delivery_timeout"),
        ("Timeout after 30s", "delivery_timeout"),
        ("read-timeout", "delivery_timeout"),
        # offline
        ("Connection refused", "runtime_offline"),
        ("connection_refused", "runtime_offline"),
        ("runtime is offline", "runtime_offline"),
        ("gateway not running", "runtime_offline"),
        ("hermes exited with status 1: It looks like Hermes isn't configured yet -- no API keys or providers found.",
         "missing_config"),
        ("hermes exited with status 1: API call failed after 3 retries: Connection error.", "runtime_offline"),
        # unknown
        ("", "unknown"),
        ("   ", "unknown"),
        ("something odd happened", "unknown"),
    ],
)
def test_classify_each_class(text: str, expected: str) -> None:
    assert r.classify_agent_error(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("429 too many requests; request timed out", "provider_rate_limit"),
        ("401 overloaded", "provider_auth_or_access"),
        ("quota exceeded: 429", "provider_quota_limit"),
        ("403 rate limit", "provider_auth_or_access"),
        ("503 context length", "provider_server_error"),
        ("context window exceeded after timeout", "context_overflow"),
        ("not configured; connection refused", "missing_config"),
        ("model not found (timeout)", "model_unavailable"),
        ("timed out: connection refused", "delivery_timeout"),
    ],
)
def test_classify_precedence(text: str, expected: str) -> None:
    assert r.classify_agent_error(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4290", "unknown"),
        ("14290 bytes", "unknown"),
        ("took 1500ms", "unknown"),
        ("id 4011", "unknown"),
        ("port 5020", "unknown"),
        ("code 50400", "unknown"),
        ("HTTP/1.1 429", "provider_rate_limit"),
        ("status_401", "provider_auth_or_access"),
        ("error-500", "provider_server_error"),
        ("[502]", "provider_server_error"),
        ("took 0.429s", "unknown"),  # a fraction's digits are no status code
        ("waited 1.500 s", "unknown"),
        ("used 1,429 tokens", "unknown"),
        ("version 2.503.1", "unknown"),
        ("got HTTP 429.", "provider_rate_limit"),  # the end of a sentence is not a decimal point
        ("status 503, retrying", "provider_server_error"),
        # a hex id's digits are no status code (a room's refusal naming its id was a provider_server_error)
        ("no room 6efc65d77d8e4b4da0c434453e503d17 here", "unknown"),
        ("delivery a429b: gone", "unknown"),
        ("took 500ms", "unknown"),
    ],
)
def test_status_codes_match_whole_numbers_only(text: str, expected: str) -> None:
    assert r.classify_agent_error(text) == expected


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("runtime_offline", r.RETRY_RESUME),
        ("delivery_timeout", r.RETRY_RESUME),
        ("provider_rate_limit", r.RETRY_RESUME),
        ("provider_server_error", r.RETRY_RESUME),
        ("context_overflow", r.RETRY_COMPRESS),
        ("provider_auth_or_access", r.RETRY_NONE),
        ("provider_quota_limit", r.RETRY_NONE),
        ("missing_config", r.RETRY_NONE),
        ("model_unavailable", r.RETRY_NONE),
        ("queued_expired", r.RETRY_NONE),
        ("agent_blocked", r.RETRY_NONE),
        ("cancelled", r.RETRY_NONE),
        ("unknown", r.RETRY_NONE),
        ("target_busy", r.RETRY_NONE),
        ("loop_guard", r.RETRY_NONE),
        ("some_future_code", r.RETRY_NONE),
        ("", r.RETRY_NONE),
    ],
)
def test_retry_action(reason: str, expected: str) -> None:
    assert r.retry_action(reason) == expected


def test_retry_action_constants() -> None:
    assert (r.RETRY_RESUME, r.RETRY_COMPRESS, r.RETRY_NONE) == ("resume", "compress_then_resume", "none")


RETRYABLE = {
    "target_busy", "runtime_offline", "queued_expired", "cancelled",
    "provider_rate_limit", "provider_server_error",
}


@pytest.mark.parametrize("reason", [*ALL_CODES, "", "future_code"])
def test_is_retryable_failed(reason: str) -> None:
    assert r.is_retryable(reason) is (reason in RETRYABLE)
    assert r.is_retryable(reason, "failed") is (reason in RETRYABLE)


@pytest.mark.parametrize("reason", ALL_CODES)
def test_is_retryable_never_for_ambiguous(reason: str) -> None:
    assert r.is_retryable(reason, "ambiguous") is False


@pytest.mark.parametrize("status", ["failed", "ambiguous", "replied", "silent"])
def test_delivery_timeout_never_retryable(status: str) -> None:
    assert r.is_retryable("delivery_timeout", status) is False


@pytest.mark.parametrize(
    ("code", "text", "expected"),
    [
        ("provider_quota_limit", "429 rate limit", "provider_quota_limit"),
        ("target_busy", "", "target_busy"),
        ("  loop_guard ", "", "loop_guard"),
        ("unknown", "429", "unknown"),
        ("", "429 rate limit", "provider_rate_limit"),
        ("shiny_new_reason", "request timed out", "delivery_timeout"),
        ("shiny_new_reason", "", "unknown"),
        ("", "", "unknown"),
    ],
)
def test_normalize_reason(code: str, text: str, expected: str) -> None:
    assert r.normalize_reason(code, text) == expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("[SILENT]", True),
        ("[silent]", True),
        ("SILENT", True),
        ("  silent\n", True),
        ("NO_REPLY", True),
        ("no_reply", True),
        ("NO REPLY", True),
        ("no   reply", True),
        ("\tNo\nReply  ", True),
        ("", False),
        ("   ", False),
        ("silent night", False),
        ("I will stay SILENT", False),
        ("[SILENT] ok", False),
        ("NO-REPLY", False),
        ("noreply", False),
        ("[ SILENT ]", False),
    ],
)
def test_is_intentional_silence(reply: str, expected: bool) -> None:
    assert r.is_intentional_silence(reply) is expected


_SILENCE_PARTS = ["silent", "[SILENT]", "no", "Reply", "NO_REPLY", "x", "İ", "\u00a0", "\u3000", "\x1c", "\x85",
                  "\u200b", "\ufeff", "\r\n", "\t", " ", ""]


@given(st.lists(st.sampled_from(_SILENCE_PARTS) | st.text(max_size=3), max_size=6))
@settings(max_examples=500, deadline=None)
def test_is_intentional_silence_is_the_whitespace_collapsed_reply_in_the_markers(parts: list[str]) -> None:
    # The definition (DESIGN 4.4), as it was written before the reply was split instead of copied whole:
    # every run of whitespace one space, stripped, lowercased, then one of the markers.
    reply = "".join(parts)
    collapsed = re.sub(r"\s+", " ", reply).strip().lower()
    assert r.is_intentional_silence(reply) is (collapsed in r.SILENCE_MARKERS)
