"""Pure: what the CLI prints for an ack, a refusal, an outcome or a status, and its exit code.

The tool's dicts are written for an LLM (they name the roster "in your system
prompt", tell it not to retry); a person at a terminal gets one line instead,
and ``--json`` prints the dict itself.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import orjson

from hermes_actors.core.clipping import clip
from hermes_actors.core.printable import printable
from hermes_actors.core.shell import shell_command
from hermes_actors.store.relay_protocol import STALE_AFTER_SECONDS

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_SIGPIPE",
    "EXIT_USAGE",
    "ack_line",
    "answer_exit_code",
    "ascii_json",
    "clip",
    "json_text",
    "not_managed_note",
    "outcome_exit_code",
    "outcome_line",
    "printable",
    "refusal_line",
    "refused_as_unmanaged",
    "rooms_table",
    "roster_table",
    "status_text",
    "surrogates_escaped",
]

EXIT_OK = 0  # replied, silent, queued (send without --wait), a healthy doctor
# refused, failed, ambiguous, no outcome (yet) or an id nobody knows, a doctor that found a blocker
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad arguments, a missing root
EXIT_SIGPIPE = 141  # stdout's reader left (`status | head`), as a shell reports a process its SIGPIPE ended

# Sentences addressed to the model that called the tool, not to a person.
_FOR_THE_MODEL = (
    "Pick a name from the roster (roles are listed in your system prompt).",
    "Pick a teammate from the roster.",
    "Compose it as plain text.",
    "Do not retry.",
    "— compose what you want to say to that agent.",
)
# the name as core.targets shows it: '<name>', or a long one cut, with its length (core.clipping.shown)
_NO_TEAMMATE = re.compile(r"^No teammate named (?P<name>'.*'(?: \([\d,]+ characters\))?) on this install, on a "
                          r"connected machine, or on a registered peer\.")


def surrogates_escaped(value: Any) -> Any:
    """Pure: ``value`` with each of its strings (dict keys too, in lists and dicts) encodable as UTF-8.

    A lone surrogate, such as an undecodable byte of a file name (``b"j-\\xff.log"`` is
    ``"j-\\udcff.log"`` in Python), is written out as the six characters ``\\udcff``, as the log lines
    show it; every other character is kept.

    Args:
        value: what a ``--json`` output holds (dicts, lists, strings, numbers, ...).

    Returns:
        A copy of its lists (tuples too, as lists) and dicts, its strings escaped; anything else as it is.
    """
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {surrogates_escaped(key): surrogates_escaped(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [surrogates_escaped(item) for item in value]
    return value


def json_text(value: Any, *, indent: bool = False, default: Callable[[Any], Any] | None = None) -> str:
    """Pure: the JSON a ``--json`` output prints: always valid UTF-8 (:func:`surrogates_escaped`).

    orjson refuses a string holding a lone surrogate (``str is not valid UTF-8: surrogates not allowed``):
    a journal file or a profile folder whose name is not UTF-8 made ``status``/``outcome``/``doctor --json``
    end with that traceback. Such strings are escaped; the rest is orjson's output as before. The one rule of
    every JSON the project shows a reader: ``serve --http``'s ``/status`` and ``/events`` are written by it too.

    Args:
        value: the dict or list to print.
        indent: indented two spaces (else one line).
        default: what a value JSON cannot say is written as (orjson's ``default``: ``str``), None: refused.

    Returns:
        The JSON text.

    Raises:
        TypeError: ``value`` holds something JSON cannot say (not a string's surrogates) and ``default`` is None,
            or what orjson never hands ``default`` (a dict key that is no str, an integer past 64 bits).
    """
    option = orjson.OPT_INDENT_2 if indent else 0
    try:
        return orjson.dumps(value, default=default, option=option).decode()
    except orjson.JSONEncodeError:
        # what ``default`` makes of a value (``str`` of a Path holding such a byte) is escaped by the same rule
        escaped_default = None if default is None else functools.partial(_escaped_default, default)
        return orjson.dumps(surrogates_escaped(value), default=escaped_default, option=option).decode()


def _escaped_default(default: Callable[[Any], Any], value: Any) -> Any:
    """``default``'s rendering of a value JSON cannot say, its strings escaped (:func:`surrogates_escaped`)."""
    return surrogates_escaped(default(value))


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _json_escape(match: re.Match[str]) -> str:
    """Pure: one non-ASCII character as JSON's ``\\uXXXX`` escape (a surrogate pair beyond the BMP)."""
    code = ord(match.group())
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def ascii_json(text: str) -> str:
    """Pure: the JSON ``text`` (:func:`json_text`) with each non-ASCII character as a ``\\uXXXX`` escape, as
    ``json.dumps(..., ensure_ascii=True)`` writes it: the same document, for a stdout whose encoding (ASCII, a C
    locale) cannot write those characters. A non-ASCII character is only ever inside a JSON string, where such an
    escape means it; the rest of the text (its indentation) is kept.

    Args:
        text: a JSON document, as :func:`json_text` returns it.

    Returns:
        The same document in ASCII.
    """
    return _NON_ASCII.sub(_json_escape, text)


# How the gateway's refusal of a DM on an install that is not Bot-Mode-managed begins (core.targets; pinned by
# tests/test_cli.py through a gateway's own refusal).
_NOT_MANAGED_REFUSAL = "This install is not Bot-Mode-managed"


def refused_as_unmanaged(answer: dict[str, Any]) -> bool:
    """Pure: whether a send's answer is the refusal of an install that is not Bot-Mode-managed.

    Told from the answer, not from the root's files: the gateway that refused (a host, or the command's
    own) may see the install otherwise than a fresh read does (a host on the real Hermes leaves off the
    profiles hermes cannot run, so a root managed only through such a profile is not managed there).

    Args:
        answer: the ack or refusal dict.

    Returns:
        True for that refusal.
    """
    return str(answer.get("error", "")).startswith(_NOT_MANAGED_REFUSAL)


def not_managed_note(root: Any) -> str:
    """The note printed where a command finds no Bot-Mode-managed profile on ``root``."""
    return (f"note: this install is not Bot-Mode-managed (no profile has ui_meta.hermes-bots), so every DM is "
            f"refused; fix: {shell_command('hermes-actors', 'enable', '--root', root)}")


def _without_reason_prefix(text: str, reason: str) -> str:
    """``target_busy: another turn…`` → ``another turn…`` (the reason is shown once, in brackets)."""
    text = text.strip()
    if reason and text.lower().startswith(f"{reason.lower()}:"):
        return text[len(reason) + 1:].strip()
    return text


def refusal_line(answer: dict[str, Any]) -> str:
    """Pure: one human line for a refusal dict (``{"error", "reason", "teammates"?, "peers"?}``).

    Returns:
        e.g. ``refused [unknown]: no teammate named 'nobody' — teammates: @hermes, @scout; peers: mini``.
    """
    reason = str(answer.get("reason") or "unknown")
    text = _without_reason_prefix(str(answer.get("error") or "no reason given"), reason)
    match = _NO_TEAMMATE.match(text)
    if match:
        text = f"no teammate named {match['name']}"
    for sentence in _FOR_THE_MODEL:
        text = text.replace(sentence, "")
    text = " ".join(text.split()).rstrip(".")
    extra = []
    teammates = answer.get("teammates")
    if isinstance(teammates, list):
        extra.append("teammates: " + (", ".join(f"@{t}" for t in teammates) or "none"))
    peers = answer.get("peers")
    if isinstance(peers, list) and peers:
        extra.append("peers: " + ", ".join(str(p) for p in peers))
    return printable(f"refused [{reason}]: {text}" + (f" — {'; '.join(extra)}" if extra else ""))


def ack_line(ack: dict[str, Any], root: str) -> str:
    """Pure: one line for an accepted DM, naming how to look its outcome up."""
    key = ack.get("delivery_id", "?")
    return printable(f"queued for {ack.get('to', '?')}: delivery {key} ({outcome_command(root, key)})")


def outcome_command(root: Any, delivery_id: str) -> str:
    """Pure: the command that looks a DM's outcome up later, quoted to run as printed (``core.shell``)."""
    return shell_command("hermes-actors", "outcome", "--root", root, delivery_id)


def outcome_line(outcome: dict[str, Any]) -> str:
    """Pure: one line for an outcome dict (replied and silent keep their sender-facing text)."""
    return printable(_outcome_line(outcome))


def _outcome_line(outcome: dict[str, Any]) -> str:
    status = str(outcome.get("status") or "")
    if status in ("replied", "silent"):
        return str(outcome.get("text") or status)
    if status in ("failed", "ambiguous"):
        reason = str(outcome.get("reason") or "unknown")
        error = _without_reason_prefix(str(outcome.get("error") or outcome.get("text") or ""), reason)
        who = outcome.get("from") or "?"
        return f"{status} [{reason}] {who}: {' '.join(error.split())}"
    if status == "pending":
        return f"pending: delivery {outcome.get('delivery_id')} has no outcome yet"
    if status == "unknown":
        why = outcome.get("error") or "no journal on this root and no running host knows it"
        return f"unknown: delivery {outcome.get('delivery_id')}: {why}"
    return f"{status or 'error'}: {outcome.get('error') or outcome}"


def answer_exit_code(answer: dict[str, Any]) -> int:
    """Pure: the exit code of a ``send`` answer (ack or refusal) when not waiting."""
    return EXIT_FAILED if "error" in answer else EXIT_OK


def outcome_exit_code(outcome: dict[str, Any]) -> int:
    """Pure: 0 replied/silent; 1 otherwise (failed, ambiguous, pending, unknown, an error).

    The exit codes (docs/operations.md, "Exit codes") are 0 ok, 1 refused/failed/ambiguous, 2 usage: a DM without an
    outcome yet, or an id nobody knows, is not ok; the printed line says which it is.
    """
    return EXIT_OK if outcome.get("status") in ("replied", "silent") else EXIT_FAILED


_ROOM_NAME_WIDTH = 24  # the name column's least width: wider when a name is longer (names are shown whole)


def rooms_table(rows: list[dict[str, Any]]) -> str:
    """Pure: the ``room list`` table: a header, then one line per room.

    A room's name is how it is addressed (as a handle is on the roster): it is shown whole, never
    cut, and the name column is as wide as the longest name as shown: escaped first (:func:`printable`:
    a ``\u202e`` is six characters on the terminal), then padded, so the room ids stay one column.

    Args:
        rows: ``list_rooms()`` rows (``name``, ``room_id``, ``state``, ``members``, ``messages``).

    Returns:
        The lines, joined by newlines, safe to print (:func:`printable`).
    """
    names = [printable(str(row["name"])) for row in rows]
    width = max([_ROOM_NAME_WIDTH, *(len(name) for name in names)])
    lines = [f"{'name':<{width}} {'room_id':<32} {'state':<10} {'messages':>8}  members"]
    for name, row in zip(names, rows, strict=True):
        members = ", ".join("@" + str(m) for m in row["members"])
        lines.append(f"{name:<{width}} {row['room_id']:<32} {row['state']:<10} "
                     f"{row.get('messages', '?'):>8}  {members}")
    return printable("\n".join(lines))


_ROSTER_TITLE_WIDTH = 20  # a title is cut to fit its column (a handle, addressed by it, never is)


def roster_table(rows: list[dict[str, Any]]) -> str:
    """Pure: the ``roster`` table: a header, then one line per bot.

    Each value is escaped first (:func:`printable`: a ``\u202e`` is six characters on the terminal), then cut
    (the title) and padded, as :func:`rooms_table` does, so the columns after it stay where the header says.

    Args:
        rows: roster rows (``handle``, ``profile``, ``title``, ``connection_id``, ``online``).

    Returns:
        The lines, joined by newlines, safe to print (:func:`printable`).
    """
    lines = [f"{'handle':<20} {'profile':<20} {'title':<20} {'connection':<16} online"]
    for row in rows:
        online = {True: "yes", False: "no", None: "unknown"}[row["online"]]
        handle, profile, conn = (printable(str(value)) for value in (row["handle"], row["profile"],
                                                                     row["connection_id"] or "local"))
        title = clip(printable(str(row["title"])), _ROSTER_TITLE_WIDTH)
        lines.append(f"@{handle:<19} {profile:<20} {title:<20} {conn:<16} {online}")
    return printable("\n".join(lines))


def _age(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return "?"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _counts(mapping: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in mapping.items()) or "none"


# claimed/ holds envelopes already handed on, replies/ answers already written: both are kept until the stale
# sweep (a seed sender's waiter reads its reply there), so their counts are no DMs in flight or waiting. The
# others wait: for a drainer, a turn, (quarantine/) the user, or (unconfirmed/) Redis to answer a send again.
_RELAY_WAITING = ("outbox", "inbox", "taken", "quarantine", "unconfirmed")
_RELAY_KEPT = ("claimed", "replies")


def _relay_dirs(relay: dict[str, Any]) -> str:
    """Pure: the relay directory counts of a status line, the kept files apart from what waits.

    Args:
        relay: the status dict's ``relay`` (a count None or absent: the directory is missing or not ours).

    Returns:
        ``outbox 0, inbox 0, taken 0, quarantine 0; kept until the 6 h sweep: claimed 2326, replies 2326``,
        or ``no relay directories``.
    """
    def counts(keys: tuple[str, ...]) -> str:
        return ", ".join(f"{k} {relay[k]}" for k in keys if relay.get(k) is not None)

    waiting, kept = counts(_RELAY_WAITING), counts(_RELAY_KEPT)
    if kept:
        kept = f"kept until the {STALE_AFTER_SECONDS // 3600} h sweep: {kept}"
    return "; ".join(part for part in (waiting, kept) if part) or "no relay directories"


def _roster_phrase(relay: dict[str, Any]) -> str:
    """Pure: what the status line says of the remote roster (the file relay's ``roster.json``, or Redis).

    Args:
        relay: the status dict's ``relay``.
    """
    if relay.get("transport") == "redis":
        url = relay.get("roster") or "(url unknown)"
        if relay.get("reachable") is False:  # the problem line below says what it means and the fix
            return f"Redis {url} UNREACHABLE (see the problem below)"
        return f"roster on Redis {url}: {relay.get('remote_agents')} agents on other machines"
    age = relay.get("roster_age_seconds")
    return "no relay roster" if age is None else f"roster {_age(age)} old, {relay.get('remote_agents')} agents"


def _peers_in_flight(count: Any) -> str:
    """Pure: what the ``peers:`` line adds for the DMs handed to ``bot_peers`` peers without an outcome yet.

    Args:
        count: the status dict's ``relay.peers_in_flight`` (None or absent: the source does not say).

    Returns:
        ``; in flight to peers: 2`` (route ``peer`` in the in-flight list), or "" for none.
    """
    if not isinstance(count, int) or count <= 0:
        return ""
    return f"; in flight to peers: {count}"


# A profile state the status line words beyond its name (ops.status: hermes still runs a turn given up on).
_STATE_SHOWN = {"busy": "busy (a turn given up on still runs in the hermes gateway: DMs to it fail target_busy)"}


def status_text(status: dict[str, Any]) -> str:
    """Pure: the human ``hermes-actors status`` report of a status dict (:mod:`hermes_actors.ops.status`)."""
    lines = []
    gw = status.get("gateway")
    if status.get("running") and gw:
        conn = gw.get("connection_id") or "no connection id"
        lines.append(f"gateway: serving {status['root']} (pid {gw.get('pid')}, up {_age(gw.get('uptime_seconds'))}, "
                     f"{conn}, {gw.get('transport')} transport)")
    else:
        lines.append(f"gateway: none serves {status['root']} (start one: "
                     f"{shell_command('hermes-actors', 'serve', '--root', status['root'])})")
        procs = status.get("processes") or []
        if procs:
            lines.append("  other gateway processes (no submit endpoint): "
                         + ", ".join(f"pid {p['pid']}" for p in procs))
    if not status.get("managed", True):
        lines.append("  not Bot-Mode-managed: every DM is refused; fix: "
                     + shell_command("hermes-actors", "enable", "--root", status["root"]))
    lines.append("profiles:")
    for p in status.get("profiles") or []:
        owner = ", live owner attached" if p.get("live_owner") else ""
        queued = f", {p['queued']} queued" if p.get("queued") else ""
        lines.append(f"  @{p['handle']:<16} {_STATE_SHOWN.get(p['state'], p['state'])}{queued}{owner}")
    flying = status.get("in_flight") or []
    lines.append(f"in flight: {len(flying)}")
    for r in flying[:20]:
        # a room member turn has no sender: its target is its label ("@alice in room 'plan'")
        who = f"@{r['sender']} → {r.get('target')}" if r.get("sender") else str(r.get("target"))
        lines.append(f"  {r['delivery_id']} {who} ({r.get('route')}, "
                     f"{_age(r.get('age_seconds'))})")
    if len(flying) > 20:
        lines.append(f"  … and {len(flying) - 20} more (--json lists them)")
    c = status.get("counters") or {}
    known = ", ".join(f"{k} {c[k]}" for k in ("accepted", "refused", "settled", "pending") if c.get(k) is not None)
    lines.append(f"counters: {known}")
    lines.append(f"  by status: {_counts(c.get('by_status') or {})}")
    lines.append(f"  by reason: {_counts(c.get('by_reason') or {})}")
    relay = status.get("relay") or {}
    lines.append(f"relay: {relay.get('transport')}; {_relay_dirs(relay)}; {_roster_phrase(relay)}")
    lines.append(f"peers: {', '.join(relay.get('peers') or []) or 'none (bot_peers in config.yaml)'}"
                 f"{_peers_in_flight(relay.get('peers_in_flight'))}")
    rooms = status.get("rooms") or []
    if rooms:
        lines.append(f"rooms: {len(rooms)}")
    for room in rooms:
        members = ", ".join("@" + str(m) for m in room.get("members") or ())
        lines.append(f"  {room.get('name')} ({room.get('room_id')}) {room.get('state')}, "
                     f"{room.get('messages')} messages, last {_age(room.get('idle_seconds'))} ago; {members}")
    for problem in status.get("problems") or []:
        lines.append(f"problem: {problem}")
    return printable("\n".join(lines))
