"""What a turn runner is (DESIGN 4.1), and the runners that come with the library.

A runner is any object with ``run_turn(turn) -> str`` or a plain callable
``fn(turn) -> str``; :func:`as_runner` turns either into a :class:`TurnRunner`.
The return value is the reply (anything but a str fails the turn, naming the
runner: :func:`checked_reply`); raising :class:`~hermes_actors.errors.TurnFailed`
fails the turn with a typed reason.

A runner whose turns never block (no I/O, no waiting: they compute and return)
may say so with ``blocking = False`` (``CallableRunner(fn, blocking=False)`` for
a callable): its turns then run inline on the ProfileActor's thread instead of
a worker thread, saving two thread hand-offs and the turn timer per DM
(:func:`runs_inline`). A runner that says so and then blocks stalls its own
profile's queue (and its turn timeout cannot fire), never another profile's.
``turn.message_agent`` waits for the Dispatcher's ack, so a turn that sends DMs
blocks: leave such a runner blocking (a ``stop()`` that begins while an inline
turn waits on that ack is held until the ask times out).

Five optional methods let a runner take part in a delivery's life:
``prepare_retry(turn, began) -> bool`` is asked before the one policy retry (False
keeps the first failure; see :func:`hermes_actors.local.turns.retry_allowed`),
``forget_failed(turn, began)`` is told when the turn failed for good (not ambiguous),
``release(delivery_id)`` once the delivery is settled, and ``never_reached(turn, since)
-> bool`` is asked at a start about a wake the previous run started and never finished
(True only when its turn provably never reached the bot: it is offered again, else it
stays ambiguous; see :func:`hermes_actors.local.turns.turn_never_reached`), and ``runs_apart(turn)
-> bool`` words why such a turn is ambiguous (True: it ran warm in a hermes gateway apart from
this host, which may still have answered it; :func:`hermes_actors.local.turns.turn_runs_apart`).
At a stop, ``running_turns()`` and ``warm_turns()`` (the deliveries whose turn runs now in a turn
process the stop ends, or warm in a hermes gateway apart from this host) word the ``ambiguous``
outcome of a turn still running (:func:`hermes_actors.local.turns.turn_places_at_stop`: asked once
per stop, on the stopping thread, for a second at most; one that hangs only costs that wording).
At a turn's timeout, ``running_turns()`` tells whether the timed-out turn's process holds the flock
(:func:`hermes_actors.local.turns.turn_process_running`: asked the same way, off the ProfileActor; one
that hangs or raises counts as a process that may, so the bot's next turn waits for that turn's end).

The real ``hermes`` CLI runner is :class:`~hermes_actors.local.command_runner.CommandRunner`;
the pieces of one CLI process it shares with the Hermes runners are in
:mod:`hermes_actors.local.cli_process`. Both are re-exported here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import BuiltinFunctionType, FunctionType, MethodType
from typing import Protocol, runtime_checkable

from hermes_actors.core.clipping import clip
from hermes_actors.core.reasons import UNKNOWN
from hermes_actors.local.cli_process import (
    REFUSAL_MARKER,
    CliResult,
    busy_text,
    exit_failure_text,
    refused_not_owned,
    resolve_cli,
    run_cli_process,
)
from hermes_actors.local.command_runner import BOT_CHAT_TURN_ARGS, CommandRunner
from hermes_actors.messages import Turn

__all__ = [
    "BOT_CHAT_TURN_ARGS",
    "REFUSAL_MARKER",
    "CallableRunner",
    "CliResult",
    "CommandRunner",
    "ReplyTypeError",
    "TurnRunner",
    "as_runner",
    "busy_text",
    "checked_reply",
    "exit_failure_text",
    "refused_not_owned",
    "resolve_cli",
    "run_cli_process",
    "runner_name",
    "runs_inline",
]


@runtime_checkable
class TurnRunner(Protocol):
    """Runs one turn and returns the reply text."""

    def run_turn(self, turn: Turn) -> str:
        """Run ``turn`` and return the reply.

        Args:
            turn: the turn to run.

        Returns:
            The reply text ("" or a silence marker is a silent outcome).

        Raises:
            TurnFailed: the turn failed with a typed (or to-be-classified) reason.
        """
        ...


class CallableRunner:
    """A :class:`TurnRunner` around a plain callable ``fn(turn) -> str``.

    Args:
        fn: the callable; its return value is the reply.
        blocking: False when ``fn`` never blocks (it computes and returns): its turns
            then run inline on the ProfileActor (see the module docstring).

    Raises:
        TypeError: ``fn`` is not callable, or ``blocking`` is not a bool.
    """

    def __init__(self, fn: Callable[[Turn], str], *, blocking: bool = True) -> None:
        if not callable(fn):
            raise TypeError(f"CallableRunner needs a callable, got {type(fn).__name__}")
        if not isinstance(blocking, bool):
            raise TypeError(f"CallableRunner blocking must be True or False, got {blocking!r}")
        self.fn = fn
        self.blocking = blocking

    def run_turn(self, turn: Turn) -> str:
        """Call ``fn(turn)`` and return its reply.

        Args:
            turn: the turn to run.

        Returns:
            The reply ``fn`` returned.

        Raises:
            ReplyTypeError: ``fn`` returned something other than a str (a TypeError naming ``fn``).
            Exception: whatever ``fn`` raised, unchanged.
        """
        return checked_reply(self.fn(turn), self.fn)

    def __repr__(self) -> str:
        return f"CallableRunner({self.fn!r})" if self.blocking else f"CallableRunner({self.fn!r}, blocking=False)"


class ReplyTypeError(TypeError):
    """A runner (or its callable, or a live owner) returned something other than a str for a turn.

    Its reason is always ``unknown`` (never retried), decided from this type, never from its text
    (:func:`~hermes_actors.local.turns.attempt_turn`): the text names the runner, and a name holding
    ``rate_limit`` or ``timeout`` is no provider's rate limit or timeout.
    """

    reason = UNKNOWN


# A runner's name in an error: its type's (or function's) qualified name, up to here (a name is code's, not data).
RUNNER_NAME_CHARS = 80


def runner_name(source: object) -> str:
    """Pure: ``source`` (a runner, a callable, a live owner) as an error names it: never its ``repr``.

    A repr can hold anything its fields hold (an API key, a 5 KB system prompt), and the error goes to
    the sender, the journal and the CLI: the name is the qualified name of a function, method or class
    (``Bot.run_turn``, ``make.<locals>.reply``), else of ``source``'s type (``ApiBot``), clipped to
    :data:`RUNNER_NAME_CHARS`. A wrapper naming what it wraps (``__wrapped__``, as ``functools.wraps``
    sets it, and the Redis claim guard) is named by the runner it wraps.

    Args:
        source: who returned the reply.

    Returns:
        The name.
    """
    try:
        source = inspect.unwrap(source)  # type: ignore[arg-type]
    except ValueError:  # a __wrapped__ cycle: the outermost is named
        pass
    named = source if isinstance(source, (type, FunctionType, BuiltinFunctionType, MethodType)) else type(source)
    return clip(str(getattr(named, "__qualname__", type(source).__name__)), RUNNER_NAME_CHARS)


def checked_reply(reply: object, source: object, what: str = "runner") -> str:
    """Pure: ``reply`` when it is a str (a reply), else the error naming who returned what.

    The one check of a turn's reply: every runner's (:func:`~hermes_actors.local.turns.attempt_turn`,
    whatever kind of runner, inline or on a worker; :class:`CallableRunner` checks its ``fn``'s, naming
    it) and a live owner's (:func:`~hermes_actors.local.live_handoff.hand_to_owner`).

    Args:
        reply: what a runner (or its callable) or a live owner returned for a turn.
        source: who returned it (named in the error by :func:`runner_name`, never its repr).
        what: what ``source`` is ("runner", "live owner").

    Returns:
        ``reply``.

    Raises:
        ReplyTypeError: ``reply`` is not a str (None, bytes, a dict): the turn fails with this
            text (``runner ApiBot returned NoneType, expected str``) instead of replying its
            ``str()``, e.g. ``'None'``.
    """
    if not isinstance(reply, str):
        raise ReplyTypeError(f"{what} {runner_name(source)} returned {type(reply).__name__}, expected str")
    return reply


def runs_inline(runner: object) -> bool:
    """Whether ``runner`` declared that its turns never block (``blocking = False``).

    Only an explicit ``False`` counts: a runner that says nothing blocks.
    """
    return getattr(runner, "blocking", True) is False


def as_runner(obj: object, what: str = "runner") -> TurnRunner:
    """Return ``obj`` as a :class:`TurnRunner`.

    Args:
        obj: an object with a callable ``run_turn`` (returned as is) or a
            plain callable (wrapped in :class:`CallableRunner`).
        what: the argument's name in the error (``runner``, ``owner``).

    Returns:
        The runner.

    Raises:
        TypeError: ``obj`` is neither.
    """
    if callable(getattr(obj, "run_turn", None)):
        return obj  # type: ignore[return-value]
    if callable(obj):
        return CallableRunner(obj)
    raise TypeError(
        f"{what} must be an object with run_turn(turn) -> str or a callable fn(turn) -> str, "
        f"got {type(obj).__name__}"
    )
