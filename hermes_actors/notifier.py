"""NotifierActor: runs ``Gateway.subscribe`` callbacks on its own thread.

Callbacks see outcomes in arrival order. A slow callback only delays later
callbacks, never an actor (the Dispatcher tells and moves on); a raising one is
logged and the others still run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loguru import logger

from actors import TypedActor, handles
from hermes_actors.messages import AddSubscriber, Flush, Notify, RemoveSubscriber

__all__ = ["NotifierActor"]


class NotifierActor(TypedActor):
    """Owns the subscriber list."""

    def __init__(self) -> None:
        super().__init__()
        self.subscribers: dict[int, Callable[[dict[str, Any]], Any]] = {}
        self.delivered = 0

    @handles(AddSubscriber)
    def _on_add(self, msg: AddSubscriber) -> None:
        self.subscribers[msg.token] = msg.callback

    @handles(RemoveSubscriber)
    def _on_remove(self, msg: RemoveSubscriber) -> None:
        self.subscribers.pop(msg.token, None)

    @handles(Notify)
    def _on_notify(self, msg: Notify) -> None:
        for token, callback in list(self.subscribers.items()):
            try:
                callback(dict(msg.outcome))
            except Exception:
                logger.exception("outcome subscriber {} raised; it stays subscribed", token)
        self.delivered += 1

    @handles(Flush)
    def _on_flush(self, msg: Flush) -> int:
        return self.delivered
