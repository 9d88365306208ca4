"""The failure-reason vocabulary and the policy built on it (docs/protocol.md, "Reasons" and "Outcomes").

Everything here is a pure function over strings: classification of free
failure text into a reason code, the retry action a reason earns, whether a
sender may safely resend, and recognition of intentional silence.
"""

from __future__ import annotations

import re

__all__ = [
    "AGENT_BLOCKED",
    "CANCELLED",
    "CONTEXT_OVERFLOW",
    "DELIVERY_TIMEOUT",
    "LOOP_GUARD",
    "MISSING_CONFIG",
    "MODEL_UNAVAILABLE",
    "PROVIDER_AUTH_OR_ACCESS",
    "PROVIDER_QUOTA_LIMIT",
    "PROVIDER_RATE_LIMIT",
    "PROVIDER_SERVER_ERROR",
    "QUEUED_EXPIRED",
    "RETRY_COMPRESS",
    "RETRY_NONE",
    "RETRY_RESUME",
    "RUNTIME_OFFLINE",
    "SILENCE_MARKERS",
    "TARGET_BUSY",
    "UNKNOWN",
    "VOCABULARY",
    "classify_agent_error",
    "is_intentional_silence",
    "is_retryable",
    "normalize_reason",
    "retry_action",
]

# ── vocabulary ──────────────────────────────────────────────────────────────

RUNTIME_OFFLINE = "runtime_offline"
QUEUED_EXPIRED = "queued_expired"
DELIVERY_TIMEOUT = "delivery_timeout"
AGENT_BLOCKED = "agent_blocked"
CANCELLED = "cancelled"
PROVIDER_AUTH_OR_ACCESS = "provider_auth_or_access"
PROVIDER_QUOTA_LIMIT = "provider_quota_limit"
PROVIDER_RATE_LIMIT = "provider_rate_limit"
PROVIDER_SERVER_ERROR = "provider_server_error"
CONTEXT_OVERFLOW = "context_overflow"
MISSING_CONFIG = "missing_config"
MODEL_UNAVAILABLE = "model_unavailable"
UNKNOWN = "unknown"
TARGET_BUSY = "target_busy"
LOOP_GUARD = "loop_guard"

VOCABULARY: frozenset[str] = frozenset(
    {
        RUNTIME_OFFLINE,
        QUEUED_EXPIRED,
        DELIVERY_TIMEOUT,
        AGENT_BLOCKED,
        CANCELLED,
        PROVIDER_AUTH_OR_ACCESS,
        PROVIDER_QUOTA_LIMIT,
        PROVIDER_RATE_LIMIT,
        PROVIDER_SERVER_ERROR,
        CONTEXT_OVERFLOW,
        MISSING_CONFIG,
        MODEL_UNAVAILABLE,
        UNKNOWN,
        TARGET_BUSY,
        LOOP_GUARD,
    }
)

# ── retry actions ───────────────────────────────────────────────────────────

RETRY_RESUME = "resume"
RETRY_COMPRESS = "compress_then_resume"
RETRY_NONE = "none"

_RETRY_ACTIONS: dict[str, str] = {
    RUNTIME_OFFLINE: RETRY_RESUME,
    DELIVERY_TIMEOUT: RETRY_RESUME,
    PROVIDER_RATE_LIMIT: RETRY_RESUME,
    PROVIDER_SERVER_ERROR: RETRY_RESUME,
    CONTEXT_OVERFLOW: RETRY_COMPRESS,
}

_RETRYABLE: frozenset[str] = frozenset(
    {
        TARGET_BUSY,
        RUNTIME_OFFLINE,
        QUEUED_EXPIRED,
        CANCELLED,
        PROVIDER_RATE_LIMIT,
        PROVIDER_SERVER_ERROR,
    }
)

# ── classification ──────────────────────────────────────────────────────────

_SEPARATORS_RE = re.compile(r"[\s_-]+")

# (reason, status codes, phrases) — first matching class wins, in this order.
_CLASSES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    (
        PROVIDER_AUTH_OR_ACCESS,
        ("401", "403"),
        ("unauthorized", "forbidden", "invalid api key", "authentication", "permission denied"),
    ),
    (
        PROVIDER_QUOTA_LIMIT,
        ("402",),
        ("quota", "insufficient_quota", "billing", "credit balance", "payment required"),
    ),
    (PROVIDER_RATE_LIMIT, ("429",), ("rate limit", "too many requests")),
    (
        PROVIDER_SERVER_ERROR,
        ("500", "502", "503", "504"),
        ("server error", "bad gateway", "service unavailable", "overloaded"),
    ),
    (
        CONTEXT_OVERFLOW,
        (),
        ("context length", "context window", "maximum context", "too many tokens", "prompt is too long"),
    ),
    # "isn't configured yet": hermes 0.19 on a profile without a model ("no API keys or providers found")
    (MISSING_CONFIG, (), ("not configured", "isn't configured", "missing config", "no provider")),
    (MODEL_UNAVAILABLE, (), ("model not found", "unknown model", "model unavailable", "does not exist")),
    (DELIVERY_TIMEOUT, (), ("timed out", "timeout")),
    # "connection error": what hermes 0.19 says when the model's server cannot be reached at all
    (RUNTIME_OFFLINE, (), ("connection refused", "connection error", "offline", "not running")),
)


def _normalize(text: str) -> str:
    """Lowercase ``text`` and fold every run of ``_``, ``-`` and whitespace into one space.

    Args:
        text: free text (failure text or a pattern phrase).

    Returns:
        The normalized text.
    """
    return _SEPARATORS_RE.sub(" ", text.lower()).strip()


def _compile_class(codes: tuple[str, ...], phrases: tuple[str, ...]) -> re.Pattern[str]:
    """Build one regex matching any whole-number status code or any normalized phrase.

    Args:
        codes: HTTP status codes; matched only when not part of a longer number (``1429``, the
            ``429`` of ``0.429 s`` or of ``1,429 tokens``) nor of a word (the ``503`` of a hex id such as
            ``…4453e503d17``: a refusal naming a room or delivery id was said to be the provider's server error).
        phrases: phrases; normalized the same way as the text they are matched against.

    Returns:
        The compiled pattern.
    """
    parts = [rf"(?<![\w.,]){re.escape(code)}(?![.,]?\d)(?![^\W\d])" for code in codes]
    parts += [re.escape(_normalize(phrase)) for phrase in phrases]
    return re.compile("|".join(parts))


_COMPILED: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (reason, _compile_class(codes, phrases)) for reason, codes, phrases in _CLASSES
)


def classify_agent_error(text: str) -> str:
    """Classify free failure text into a reason code (docs/protocol.md, "Reasons").

    Matching is case-insensitive, treats ``_``, ``-`` and spaces alike, and
    matches status codes only as whole numbers. The first matching class wins.

    Args:
        text: the failure text (stderr, an exception message, a peer's error).

    Returns:
        A reason code from :data:`VOCABULARY`; ``unknown`` when nothing matches
        or the text is empty.
    """
    normalized = _normalize(str(text or ""))
    if not normalized:
        return UNKNOWN
    for reason, pattern in _COMPILED:
        if pattern.search(normalized):
            return reason
    return UNKNOWN


def retry_action(reason: str) -> str:
    """The automatic retry a failure reason earns (exactly one, same session).

    Args:
        reason: a reason code.

    Returns:
        :data:`RETRY_RESUME`, :data:`RETRY_COMPRESS` or :data:`RETRY_NONE`.
    """
    return _RETRY_ACTIONS.get(reason, RETRY_NONE)


def is_retryable(reason: str, status: str = "failed") -> bool:
    """The outcome's ``retryable`` flag: is resending safe and useful?

    Args:
        reason: the outcome's reason code.
        status: the outcome's status; ``ambiguous`` is never retryable.

    Returns:
        True for target_busy, runtime_offline, queued_expired, cancelled,
        provider_rate_limit and provider_server_error; False otherwise, and
        always False for ``ambiguous`` outcomes and ``delivery_timeout``.
    """
    if status == "ambiguous":
        return False
    return reason in _RETRYABLE


def normalize_reason(code: str, text: str = "") -> str:
    """Guard a reason code received from elsewhere against vocabulary drift.

    Args:
        code: the reason code as received (may be empty, or a newer peer's code).
        text: the accompanying failure text, classified when the code is unusable.

    Returns:
        ``code`` (stripped, lowercased) when it is in :data:`VOCABULARY`, else
        the classification of ``text``.
    """
    cleaned = str(code or "").strip().lower()
    if cleaned in VOCABULARY:
        return cleaned
    return classify_agent_error(text)


# ── silence ─────────────────────────────────────────────────────────────────

SILENCE_MARKERS: frozenset[str] = frozenset({"[silent]", "silent", "no_reply", "no reply"})

def is_intentional_silence(reply: str) -> bool:
    """Whether a reply is an intentional non-answer (docs/protocol.md, "Outcomes").

    Args:
        reply: the whole reply text.

    Returns:
        True when the whole reply is ``[SILENT]``, ``SILENT``, ``NO_REPLY`` or
        ``NO REPLY``, ignoring case, surrounding whitespace and the width of
        internal whitespace.
    """
    # Every marker is one or two words: splitting stops after the third word, so a reply (often KBs) is
    # never copied whole. str.split() and the regex class \s both split on str.isspace() characters.
    words = str(reply or "").split(None, 2)
    return len(words) <= 2 and " ".join(words).lower() in SILENCE_MARKERS
