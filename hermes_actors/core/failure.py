"""Pure: the outcomes a failed Dispatcher gives the deliveries only its memory held.

The Dispatcher is the owner of every outcome; when it fails (an error escaped one
of its handlers) the gateway can no longer run or settle anything. What is on
disk is left alone: a journaled DM is settled by the next start on the root
(re-offered if it never started, ``ambiguous`` if it did), and the relay's
envelopes are resumed or handed back by it. Everything else was acked from
memory only and would be lost with the actor, so each gets its outcome here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hermes_actors.core import outcomes
from hermes_actors.messages import Outcome

__all__ = ["HeldDelivery", "failure_text", "outcomes_after_failure"]

# Routes whose deliveries the relay keeps (our envelopes in ``outbox/``, relayed-in ones it hands back).
_RELAY_KEEPS = frozenset({"relay", "relay-in"})


@dataclass(frozen=True, slots=True)
class HeldDelivery:
    """A delivery the failed Dispatcher held.

    Attributes:
        delivery_id: its id.
        label: its target as the ack named it.
        route: ``local``, ``relay``, ``relay-in``, ``peer`` or ``room``.
        journaled: the journal records it (durable mode).
        started: it was handed on (queued on its ProfileActor, a peer, a room) and may have run;
            False for an acked DM the Dispatcher never took (still in its mailbox).
    """

    delivery_id: str
    label: str
    route: str
    journaled: bool
    started: bool


def failure_text(error: BaseException | None) -> str:
    """Pure: the sentence naming the failure, e.g. "The gateway's dispatcher failed (KeyError: 'x')."."""
    what = "an unknown error" if error is None else f"{type(error).__name__}: {error}"
    return f"The gateway's dispatcher failed ({what})."


def outcomes_after_failure(
    held: Iterable[HeldDelivery], arrived: Mapping[str, Outcome], why: str
) -> list[Outcome]:
    """Pure: the outcome of each delivery only the failed Dispatcher's memory held.

    Args:
        held: the deliveries it held, pending first, then those still in its mailbox.
        arrived: outcomes that reached its mailbox but were never handled (by delivery id).
        why: the failure, from :func:`failure_text`.

    Returns:
        One outcome per delivery that is neither journaled nor kept by the relay, in ``held`` order:
        its arrived outcome; else ``ambiguous`` when it may have run; else ``failed``
        (``runtime_offline``, NOT delivered).
    """
    result: list[Outcome] = []
    seen: set[str] = set()
    for item in held:
        key = item.delivery_id
        if item.journaled or item.route in _RELAY_KEEPS or key in seen:
            continue
        seen.add(key)
        if key in arrived:
            result.append(arrived[key])
        elif item.started:
            result.append(outcomes.ambiguous(key, item.label, why))
        else:
            text = f"{why} The message was NOT delivered; send it again once the gateway is back."
            result.append(outcomes.failed(key, item.label, text, "runtime_offline"))
    return result
