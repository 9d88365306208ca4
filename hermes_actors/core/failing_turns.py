"""Pure: a local bot whose turns keep failing, said once at WARNING, and once at INFO when they run again.

A bot whose model fails every turn (HTTP 500, a spent quota, no model configured) fails each
DM to it, each wake of it and each of its room turns; each is one INFO line (``delivery …:
failed [reason]``), below what ``serve`` shows by default. So the Dispatcher, which sees the
outcome of every turn of its local profiles, keeps one :class:`~hermes_actors.core.spell.Spell`
per profile: at :data:`SAY_AFTER` turn failures in a row it says one WARNING naming the bot, the
last reason and error and what to do; nothing more while the failures go on; one INFO once a turn
of that bot succeeds again.

What counts, from the outcomes a profile's ProfileActor settles (a DM's, a relayed-in DM's, a wake's,
a room turn's; the runner's one automatic retry is part of its turn):

- a failure: ``failed`` with a reason of :data:`TURN_FAILURES` — the provider's and the model's errors,
  ``missing_config``, ``context_overflow``, ``delivery_timeout`` (the runner's own, or
  ``turn_timeout_seconds`` run out on a turn that began), ``runtime_offline`` (hermes or the model's
  server not reachable) and ``unknown`` (a runner that raised);
- a success: ``replied`` or ``silent``;
- neither (the spell goes on as it was): refusals and DMs that never ran — ``target_busy`` (a full
  queue, a wait that ran out, the Bot Chat open elsewhere), ``loop_guard``, ``cancelled`` (a stop),
  ``queued_expired`` — and ``ambiguous`` (the result is not known). DMs to other machines or peers are
  settled by no ProfileActor of ours: never counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hermes_actors.core import reasons as r
from hermes_actors.core.clipping import clip
from hermes_actors.core.shell import shell_command
from hermes_actors.core.spell import Spell
from hermes_actors.messages import Outcome

__all__ = ["ERROR_CHARS", "SAY_AFTER", "TURN_FAILURES", "Said", "advice", "again_text", "failing_text", "turn_ended"]

SAY_AFTER = 3  # turn failures in a row of one bot before its WARNING (one or two are said per DM at INFO only)
ERROR_CHARS = 200  # the last error's text, cut to one line of at most this many characters

TURN_FAILURES: frozenset[str] = frozenset({
    r.PROVIDER_AUTH_OR_ACCESS, r.PROVIDER_QUOTA_LIMIT, r.PROVIDER_RATE_LIMIT, r.PROVIDER_SERVER_ERROR,
    r.MODEL_UNAVAILABLE, r.MISSING_CONFIG, r.CONTEXT_OVERFLOW, r.DELIVERY_TIMEOUT, r.RUNTIME_OFFLINE, r.UNKNOWN,
})


@dataclass(frozen=True, slots=True)
class Said:
    """A line to log.

    Attributes:
        level: the loguru level (``WARNING``, ``INFO``).
        text: the line.
    """

    level: str
    text: str


def turn_ended(
    spell: Spell, outcome: Outcome, *, handle: str, profile: str, root: Path, hermes: bool
) -> tuple[Spell, Said | None]:
    """Pure: one outcome a profile's ProfileActor settled, and what it changes in the profile's spell.

    Args:
        spell: the profile's spell so far (``Spell()`` when none).
        outcome: the outcome.
        handle: the profile's handle (``carol``; ``hermes`` for the default profile), as the lines name it.
        profile: its folder id (``hermes -p`` takes it).
        root: the Hermes root (``doctor --root`` takes it).
        hermes: its turns run on the real Hermes (the advice names hermes' commands), else on a runner of
            the embedder's or the demo bots.

    Returns:
        The spell after it, and the line to log now: the WARNING at the :data:`SAY_AFTER`-th failure in a row,
        the INFO at the success that ends a spell that was said, else None.
    """
    if outcome.status in ("replied", "silent"):
        spell, failures = spell.landed()
        return spell, (Said("INFO", again_text(handle, failures)) if failures else None)
    if outcome.status != "failed" or outcome.reason not in TURN_FAILURES:
        return spell, None
    spell, say = spell.failed(SAY_AFTER)
    if not say:
        return spell, None
    text = failing_text(handle, spell.failures, outcome.reason, outcome.error,
                        advice(outcome.reason, profile=profile, root=root, hermes=hermes))
    return spell, Said("WARNING", text)


def failing_text(handle: str, failures: int, reason: str, error: str, todo: str) -> str:
    """Pure: the WARNING of a bot whose turns keep failing.

    Args:
        handle: the bot's handle.
        failures: its turn failures in a row.
        reason: the last one's reason code.
        error: the last one's error text (cut to one line of :data:`ERROR_CHARS` characters here).
        todo: what to do (:func:`advice`).

    Returns:
        E.g. ``@carol's turns keep failing: 3 in a row, the last provider_server_error (HTTP 500 …). Its DMs,
        wakes and room turns fail until it is fixed; check its model and its provider (…). Said once: an INFO
        line says when its turns run again.``
    """
    return (f"@{handle}'s turns keep failing: {failures} in a row, the last {reason} ({clip(error, ERROR_CHARS)}). "
            f"Its DMs, wakes and room turns fail until it is fixed; {todo}. Said once: an INFO line says when its "
            f"turns run again.")


def again_text(handle: str, failures: int) -> str:
    """Pure: the INFO of a bot whose turns run again, e.g. ``@carol's turns run again after 4 failures``."""
    return f"@{handle}'s turns run again after {failures} failures"


def advice(reason: str, *, profile: str, root: Path, hermes: bool) -> str:
    """Pure: what to do about turns that fail with ``reason``, by its family.

    Args:
        reason: the last failure's reason code (one of :data:`TURN_FAILURES`).
        profile: the bot's folder id.
        root: the Hermes root.
        hermes: its turns run on the real Hermes (else the fix is in the runner the gateway was given).

    Returns:
        The advice, without a final period.
    """
    doctor = f"`{shell_command('hermes-actors', 'doctor', '--root', root)}`"
    if not hermes:
        return f"the runner this gateway was started with fails them: see its error; {doctor} checks the setup"
    model = f"`{shell_command('hermes', '-p', profile, 'model')}`"
    return _ADVICE.get(reason, _ADVICE_ELSE).format(model=model, doctor=doctor)


# what to do, by reason family ({model}: `hermes -p NAME model`; {doctor}: `hermes-actors doctor --root R`)
_ADVICE: dict[str, str] = {
    r.PROVIDER_AUTH_OR_ACCESS: "its provider refuses its API key or access: check the key and the provider it uses "
                               "({model})",
    r.PROVIDER_QUOTA_LIMIT: "its provider account is out of quota or credit: check its billing, or give it another "
                            "model ({model})",
    r.PROVIDER_RATE_LIMIT: "its provider keeps rate-limiting it: send it fewer DMs, raise the limit, or give it "
                           "another model ({model})",
    r.MISSING_CONFIG: "it has no model it can use: set model.default and its provider in its config.yaml ({model}; "
                      "{doctor})",
    r.CONTEXT_OVERFLOW: "its session outgrew its model's context, even compressed: start its session afresh in hermes "
                        "or give it a model with a larger context ({model})",
    r.DELIVERY_TIMEOUT: "its turns do not finish in time: check that its model answers ({model}) and "
                        "bot_mode.turn_timeout_seconds",
    r.RUNTIME_OFFLINE: "hermes or its model's server cannot be reached: {doctor}, and check its model ({model})",
    r.UNKNOWN: "see the error; {doctor} checks the setup, and check its model ({model})",
}
_ADVICE_ELSE = "check its model and its provider ({model}; {doctor})"  # server errors, model unavailable
