"""Where ``Gateway.wait_outcome`` finds an outcome, and the waits a stop must wake.

While the gateway runs it asks the Dispatcher; once the Dispatcher stopped (or failed)
it answers from the outcomes the Dispatcher handed over; before a start and after a
stop, from the root's journal and relay files. :class:`OutcomeWaits` keeps the
handed-over outcomes and the waits on the Dispatcher, which a stop answers at once,
so none sits out its timeout on a Dispatcher that will never answer, and the root's
journals as read so far (:class:`~hermes_actors.ops.journal_index.JournalIndex`): a look-up
in the files reads only what was appended since the last one, not every journal again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pykka

from actors import ActorGone, AskTimeout, ask
from hermes_actors.facade.options import ASK_TIMEOUT
from hermes_actors.local.outcome_book import Packed, unknown_delivery, unpack_outcome
from hermes_actors.local.sending import outcome_future
from hermes_actors.messages import CheckOutcome
from hermes_actors.ops.journal_index import JournalIndex

__all__ = ["CHECK_GRACE", "OutcomeWaits", "outcome_on_file"]

# How long past the caller's timeout wait_outcome waits for the Dispatcher to say where a DM stands: a
# wait_outcome(id, t) returns within t + CHECK_GRACE, even when the Dispatcher does not answer.
CHECK_GRACE = 2.0


class _Stopped(Exception):
    """Set on a wait's future when the gateway stopped while it waited (never leaves this module)."""


def outcome_on_file(root: Path, delivery_id: str, *, journals: JournalIndex,
                    running: bool = False, set_aside: Sequence[str] = ()) -> dict[str, Any]:
    """What the root's journal and relay files know of ``delivery_id``.

    ``wait_outcome`` reads them while no gateway runs here, and for an id the running gateway never
    issued: another gateway on the same root may have journaled it (it stopped, or still runs).

    Args:
        root: the Hermes root.
        delivery_id: the DM's id.
        journals: the root's journals as this gateway read them so far (only what was appended since is read).
        running: this gateway runs (the errors then say the DM is another gateway's).
        set_aside: the journal entries this gateway's start moved into quarantine (one line each,
            :attr:`~hermes_actors.store.journal.Journal.set_aside`): a ``KeyError`` names them, with the
            journal files the look-up refused (a symlink, another user's file).

    Returns:
        The outcome dict.

    Raises:
        TimeoutError: the DM is journaled (or on the relay) without an outcome yet: the next
            gateway on the root runs it (or reads its reply), or the other gateway holding it settles it.
        KeyError: neither this gateway nor the root's files know the id (never acked on the root, or
            its outcome is older than the ones kept: :func:`~hermes_actors.local.outcome_book.unknown_delivery`).
    """
    from hermes_actors.ops.journal_view import find_outcome

    _refuse_non_id(delivery_id)
    unread: list[str] = []
    found = find_outcome(root, delivery_id, index=journals, unread_journals=unread)
    if found.get("status") == "pending":
        if running:  # not this gateway's: nothing here will be told when it settles
            raise TimeoutError(f"no outcome for delivery {delivery_id} yet: another gateway on {root} holds it "
                               f"({found.get('error')}); ask that gateway, or `hermes-actors outcome` later")
        raise TimeoutError(f"no outcome for delivery {delivery_id} yet and the gateway is not running: "
                           f"{found.get('error')}; the next gateway on {root} settles it")
    if found.get("status") == "unknown":
        if running:
            raise KeyError(unknown_delivery(delivery_id, root, [*unread, *set_aside]))
        aside = "".join(f"; {line}" for line in set_aside)
        raise KeyError(f"unknown delivery id {delivery_id!r} (the gateway is not running; {found.get('error')}{aside})")
    return found


def _refuse_non_id(delivery_id: Any) -> None:
    """Refuse what is not shaped like a delivery id (32 lowercase hex characters), whatever its type.

    Args:
        delivery_id: the id asked for, as given.

    Raises:
        KeyError: not a delivery id (no gateway ever issued it): ``None``, ``5``, ``"xyz"``, and an unhashable
            ``["x"]`` or ``{}`` alike, which raised a bare ``TypeError: unhashable type`` from the look-up.
    """
    from hermes_actors.core.clipping import shown
    from hermes_actors.core.ids import is_delivery_id

    if not is_delivery_id(delivery_id):
        raise KeyError(f"unknown delivery id {shown(delivery_id)} (not a delivery id)")


class OutcomeWaits:
    """The outcomes a stopped (or failed) Dispatcher handed over, and the waits on a running one."""

    def __init__(self) -> None:
        # as the Dispatcher's book kept them (packed): only the outcome asked for is rebuilt (final)
        self._final: dict[str, Packed] = {}
        # wait_outcome calls waiting on the Dispatcher (future → delivery id): answered at stop
        # (a journaled DM is settled by the next start)
        self._waits: dict[pykka.ThreadingFuture[dict[str, Any]], str] = {}
        self._lock = threading.Lock()
        # the root's journals as read so far: a look-up in the files reads only what was appended since
        self._journals = JournalIndex()
        # what the last start moved into quarantine instead of adopting (Journal.set_aside): a KeyError names it
        self.set_aside: list[str] = []

    @property
    def waiting(self) -> int:
        """How many calls wait on the Dispatcher now."""
        return len(self._waits)

    def final(self, delivery_id: str) -> dict[str, Any] | None:
        """A new dict of the handed-over outcome of ``delivery_id``, or None."""
        packed = self._final.get(delivery_id)
        # a copy: an outcome marshal could not pack is kept as its dict, which a caller must not change
        return dict(unpack_outcome(delivery_id, packed)) if packed is not None else None

    def keep(self, final: Mapping[str, Packed], *, replace: bool) -> None:
        """Keep the outcomes a Dispatcher handed over, as they are (``OutcomeBook.export``: packed, or dicts).

        Args:
            final: delivery id → outcome, as the Dispatcher's book kept it.
            replace: ``final`` wins over an outcome kept before (a clean stop's export); else the
                kept one wins (a failing Dispatcher's own, which a later stop only completes).
        """
        self._final = {**self._final, **final} if replace else {**final, **self._final}

    def answer(self, delivery_id: str, timeout: float, settling: Callable[[], pykka.ActorRef[Any] | None], *,
               root: Path, stopped: Callable[[], bool]) -> dict[str, Any]:
        """The outcome of ``delivery_id`` (``Gateway.wait_outcome``), waiting at most ``timeout`` seconds.

        Args:
            delivery_id: the DM's id.
            timeout: seconds (0: where the DM stands, without waiting).
            settling: the Dispatcher while it settles DMs (the gateway runs, or stops and waits for
                its turns); None: the root's files answer. Read once no kept outcome answered.
            root: the Hermes root.
            stopped: whether the gateway has stopped (then the wait just registered is woken at once).

        Returns:
            The outcome dict.

        Raises:
            TimeoutError: no outcome in time (or the root's files hold the DM without an outcome yet).
            KeyError: neither the Dispatcher nor the root's files know the id, or it is not a delivery id.
        """
        _refuse_non_id(delivery_id)  # before any look-up: an unhashable one cannot be looked up
        deadline = time.monotonic() + timeout
        final = self.final(delivery_id)
        if final is not None:
            return final
        dispatcher = settling()
        if dispatcher is None:
            return outcome_on_file(root, delivery_id, journals=self._journals, set_aside=self.set_aside)
        try:
            if timeout > 0:
                future = outcome_future(dispatcher, delivery_id)
                with self._lock:
                    self._waits[future] = delivery_id
                if stopped():  # stopped while registering: end() may have run before
                    self.end()
                try:
                    return dict(future.get(timeout=timeout))
                except pykka.Timeout:
                    pass
                finally:
                    with self._lock:
                        self._waits.pop(future, None)
            # A poll, or the time ran out: ask where it stands. The told request may not have been
            # handled yet, and an id the Dispatcher never issued is a KeyError all the same. The ask gets
            # what is left of the caller's time, and a little more (a busy Dispatcher answers a poll too),
            # never a full ASK_TIMEOUT on top of it.
            answer_within = max(deadline - time.monotonic(), 0.0) + CHECK_GRACE
            record = ask(dispatcher, CheckOutcome(delivery_id), timeout=min(answer_within, ASK_TIMEOUT))
        except (ActorGone, _Stopped):  # stopped since the caller's check: its outcomes were kept, if it had this one
            final = self.final(delivery_id)
            if final is not None:
                return final
            return outcome_on_file(root, delivery_id, journals=self._journals, set_aside=self.set_aside)
        except KeyError:  # not issued here: another gateway on this root may have journaled it (DESIGN 3)
            return outcome_on_file(root, delivery_id, running=True, journals=self._journals,
                                   set_aside=self.set_aside)
        except AskTimeout as exc:
            raise TimeoutError(f"no outcome for delivery {delivery_id} within {timeout:g}s (the Dispatcher did "
                               f"not say where it stands within {CHECK_GRACE:g}s more: it is busy or stuck; "
                               "wait_outcome again later)") from exc
        if record is None:
            raise TimeoutError(f"no outcome for delivery {delivery_id} within {timeout:g}s")
        return dict(record)

    def end(self) -> None:
        """Wake every wait still on the stopped Dispatcher: it answers from the kept outcomes or the root's
        files instead (see :meth:`wait_on`)."""
        with self._lock:
            waits, self._waits = self._waits, {}
        for future in waits:
            with contextlib.suppress(Exception):  # already answered by the Dispatcher: that answer stands
                future.set_exception(exc_info=(_Stopped, _Stopped(), None))
