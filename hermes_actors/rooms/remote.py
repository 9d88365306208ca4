"""Group rooms through the host of a root: the submit endpoint's ``room`` op, both ends.

The process hosting a root's actors (``hermes-actors serve``, or the hermes
gateway with the plugin) is the one gateway that drives its rooms (it holds
``bot_relay/rooms/.owner.lock``), so another process, such as the ``room``
commands, asks it through ``bot_relay/run/submit.sock``.

Server side, :func:`room_handler` answers a parsed
:class:`~hermes_actors.hermes.submit_protocol.RoomCall`:

==========  ======================================  =======================================
action      fields                                  answer
==========  ======================================  =======================================
create      ``name``, ``members``                   the room dict of ``create_room``
send        ``room``, ``sender``, ``text``          the ack or refusal of ``room_send``
show        ``room``                                ``{"transcript": [...]}``
list        –                                       ``{"rooms": [...]}``
disband     ``room``                                the room dict, ``state: "disbanded"``
wait        ``room``, ``wait`` (0–300 s)            ``{"state": ..., "settled": bool}``
==========  ======================================  =======================================

What the Gateway method would raise (``ValueError`` for a bad name or members,
``KeyError`` for an unknown room, ``RuntimeError`` when the rooms are unavailable or a room's file could not be
written, ``RoomStopped`` when a wait was cut short)
is answered ``{"error": <its text>, "reason": "unknown", "error_type": <its class
name>}``; client side, :class:`HostRooms` raises the same exception again, so a
caller cannot tell the host's rooms from its own gateway's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes_actors.core.reasons import UNKNOWN
from hermes_actors.errors import RoomStopped
from hermes_actors.hermes.submit_protocol import MAX_OUTCOME_WAIT, RoomCall

if TYPE_CHECKING:
    from hermes_actors.gateway import Gateway

__all__ = ["WAIT_SLICE", "HostRooms", "room_handler"]

WAIT_SLICE = 60.0  # seconds the host is asked to wait at once (at most MAX_OUTCOME_WAIT)
_TIMEOUT = 30.0  # seconds an answer may take besides the wait (a create writes a file, a send an fsync)
_RAISED: dict[str, type[Exception]] = {"ValueError": ValueError, "KeyError": KeyError, "RuntimeError": RuntimeError,
                                       "RoomStopped": RoomStopped}


def _raised(exc: Exception) -> dict[str, Any]:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return {"error": text, "reason": UNKNOWN, "error_type": type(exc).__name__}


def _answer(gw: Gateway, call: RoomCall) -> dict[str, Any]:
    if call.action == "create":
        return gw.create_room(call.name, list(call.members))
    if call.action == "send":
        return gw.room_send(call.room, call.sender, call.text)
    if call.action == "show":
        return {"transcript": gw.room_transcript(call.room)}
    if call.action == "list":
        return {"rooms": gw.list_rooms()}
    if call.action == "disband":
        return gw.disband_room(call.room)
    try:
        return {"state": gw.wait_room_idle(call.room, timeout=call.wait), "settled": True}
    except TimeoutError:
        return {"state": "busy", "settled": False}


def room_handler(gw: Gateway) -> Callable[[RoomCall], dict[str, Any]]:
    """The submit server's ``room`` op for a running gateway.

    Args:
        gw: the gateway hosting the root.

    Returns:
        A function answering one :class:`RoomCall` (the table in the module docstring).
    """

    def handle(call: RoomCall) -> dict[str, Any]:
        try:
            return _answer(gw, call)
        except (ValueError, KeyError, RuntimeError) as exc:  # the caller's to know, as the Gateway would raise it
            return _raised(exc)

    return handle


class HostRooms:
    """The rooms of the host serving ``root``, with the ``Gateway`` room methods' names and answers.

    Every method raises what the host's Gateway raised (``ValueError``, ``KeyError``,
    ``RuntimeError``), and also:

    Raises:
        HostOffline: nothing serves ``root`` (any more).
        HostLost: the host closed the connection without answering (a ``send`` may or may not be posted).
        TimeoutError: the host did not answer in time.
        RuntimeError: the host refused the request (e.g. an older host without the ``room`` op).

    Args:
        root: the Hermes root.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = root

    @classmethod
    def if_served(cls, root: str | Path) -> HostRooms | None:
        """The host's rooms when a host serves ``root``, else None."""
        from hermes_actors.hermes.submit_client import ping

        return cls(root) if ping(root) is not None else None

    def _call(self, action: str, *, timeout: float = _TIMEOUT, **fields: Any) -> dict[str, Any]:
        from hermes_actors.hermes.submit_client import request

        answer = request(self.root, {"op": "room", "action": action, **fields}, timeout=timeout)
        kind = _RAISED.get(str(answer.get("error_type")))
        if kind is not None:
            raise kind(str(answer.get("error")))
        if "error" in answer and action != "send":  # a send's refusal is its answer
            raise RuntimeError(f"the host of {self.root} refused the room request: {answer['error']}")
        return answer

    def create_room(self, name: str, members: list[str]) -> dict[str, Any]:
        """See :meth:`hermes_actors.gateway.Gateway.create_room`."""
        return self._call("create", name=name, members=list(members))

    def room_send(self, room: str, sender: str, text: str) -> dict[str, Any]:
        """See :meth:`hermes_actors.gateway.Gateway.room_send`."""
        return self._call("send", room=room, sender=sender, text=text)

    def room_transcript(self, room: str) -> list[dict[str, Any]]:
        """See :meth:`hermes_actors.gateway.Gateway.room_transcript`."""
        entries = self._call("show", room=room).get("transcript")
        if not isinstance(entries, list):
            raise RuntimeError(f"the host of {self.root} answered no transcript")
        return entries

    def list_rooms(self) -> list[dict[str, Any]]:
        """See :meth:`hermes_actors.gateway.Gateway.list_rooms`."""
        rows = self._call("list").get("rooms")
        if not isinstance(rows, list):
            raise RuntimeError(f"the host of {self.root} answered no rooms")
        return rows

    def disband_room(self, room: str) -> dict[str, Any]:
        """See :meth:`hermes_actors.gateway.Gateway.disband_room`."""
        return self._call("disband", room=room)

    def wait_room_idle(self, room: str, timeout: float = 60) -> str:
        """See :meth:`hermes_actors.gateway.Gateway.wait_room_idle`; the host waits in slices of ``WAIT_SLICE``."""
        deadline = time.monotonic() + timeout
        while True:
            wait = max(0.0, min(WAIT_SLICE, MAX_OUTCOME_WAIT, deadline - time.monotonic()))
            answer = self._call("wait", room=room, wait=wait, timeout=wait + _TIMEOUT)
            if answer.get("settled") is True:
                return str(answer.get("state"))
            if time.monotonic() >= deadline:
                raise TimeoutError(f"room {room!r} did not become idle within {timeout}s")
