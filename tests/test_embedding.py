"""Embedding a Gateway in a script (found by the review of the Python API): a script that never stops its
gateway still exits, a fork()ed child refuses the gateway it inherited, an interrupt while start() runs
leaves nothing running, and wait_outcome is bounded by its timeout when the Dispatcher does not answer."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from roots import RecordingRunner, held_on, make_root, send_dm

from hermes_actors import Gateway
from hermes_actors.facade.outcomes import CHECK_GRACE
from hermes_actors.local.dispatcher import DispatcherActor

WAIT = 30.0


# ── 4. wait_outcome is bounded by its timeout ───────────────────────────────


def test_wait_outcome_is_bounded_by_its_timeout_when_the_dispatcher_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: once the wait ran out, wait_outcome asked the Dispatcher where the DM stands with a 30 s
    timeout of its own: a Dispatcher that did not answer made wait_outcome(id, t) take t + 30 s. Now the whole
    call returns within t + CHECK_GRACE with the documented TimeoutError."""
    release_turn, release_check = threading.Event(), threading.Event()
    original = DispatcherActor._on_check

    def stuck(self: DispatcherActor, msg: Any) -> Any:
        release_check.wait(WAIT * 2)
        return original(self, msg)

    monkeypatch.setattr(DispatcherActor, "_on_check", stuck)
    runner = RecordingRunner(held_on("held", release_turn))
    gw = Gateway(make_root(tmp_path), runner=runner)
    gw.start()
    try:
        key = send_dm(gw, "held")
        runner.wait_entered(1, timeout=WAIT)
        for timeout in (0.0, 0.5):
            began = time.monotonic()
            with pytest.raises(TimeoutError, match=f"no outcome for delivery {key} within"):
                gw.wait_outcome(key, timeout=timeout)
            # t + CHECK_GRACE, and room for a loaded machine; the bug took t + 30 s
            assert time.monotonic() - began < timeout + CHECK_GRACE + 10, timeout
    finally:
        release_check.set()
        release_turn.set()
        gw.stop()
