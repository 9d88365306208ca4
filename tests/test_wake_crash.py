"""The sender wake-up across kill -9: exactly once, never re-run once it may have started.

Like the crash matrix, a child (``tests/crash_gateway.py send --wake``) sends one DM
hermes → bob with ``bot_mode.wake_sender: true`` and is SIGKILLed at a named wake
crash point; a second child restarts on the same root. ``turns.log`` counts every
runner entry (bob's turn, then hermes' wake turn).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crash_procs import journal_ids, run_child, turns_logged
from roots import make_root

from hermes_actors.core.wake import wake_id
from hermes_actors.faults import WAKE_CRASH_POINTS


def _plain(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != "event"}


def test_the_wake_crash_points_are_named() -> None:
    assert WAKE_CRASH_POINTS == ("after-outcome-before-wake", "mid-wake")


def test_a_crash_after_the_outcome_before_the_wake_wakes_once_after_the_restart(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    first = run_child(root, "send", "--wake", crash_at="after-outcome-before-wake")
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    (dm,) = journal_ids(root)  # only the DM: the wake was never written
    wake = wake_id(dm)
    assert turns_logged(root) == [dm]

    second = run_child(root, "recover", "--wake", dm)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.of("recovered")[0]["counts"]["redelivered"] == 1
    outcomes = {e["delivery_id"]: _plain(e) for e in second.of("outcome")}
    assert outcomes[dm]["status"] == "replied"
    assert outcomes[wake]["status"] == "replied" and outcomes[wake]["reply"] == f"reply to {wake}"
    assert turns_logged(root) == [dm, wake]  # the wake ran once, after the restart
    (subscribed,) = second.of("subscribed")
    assert [o["delivery_id"] for o in subscribed["outcomes"]] == [dm]  # the wake's outcome is not a DM outcome

    third = run_child(root, "recover", "--wake", dm)  # settled both: nothing runs or is reported again
    assert third.returncode == 0, third.stderr[-2000:]
    assert third.of("recovered")[0]["counts"] == {"reoffered": 0, "ambiguous": 0, "redelivered": 0, "known": 2}
    assert third.of("subscribed")[0]["outcomes"] == []
    assert turns_logged(root) == [dm, wake]


def test_a_crash_mid_wake_is_not_rerun(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    first = run_child(root, "send", "--wake", crash_at="mid-wake")
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    accepted = journal_ids(root)
    assert len(accepted) == 2, accepted  # the DM, then its wake
    dm, wake = accepted
    assert wake == wake_id(dm) and journal_ids(root, "started") == [dm, wake]
    assert turns_logged(root) == [dm]  # the kill came before the wake's runner was entered

    second = run_child(root, "recover", "--wake", dm)
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.of("recovered")[0]["counts"]["ambiguous"] == 1
    outcomes = {e["delivery_id"]: _plain(e) for e in second.of("outcome")}
    assert outcomes[dm]["status"] == "replied"
    assert outcomes[wake]["status"] == "ambiguous"  # it may have started: never run a second time
    assert turns_logged(root) == [dm]
    (subscribed,) = second.of("subscribed")
    assert wake not in [o["delivery_id"] for o in subscribed["outcomes"]]
