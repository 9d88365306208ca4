"""A local bot whose turns keep failing is said once at WARNING, and once at INFO when they run again.

Review: `serve` on hermes 0.19 with a bot whose model answered HTTP 500 every turn: its DMs failed
provider_server_error, its wakes were retried every minute, and serve's default log (WARNING and up)
said nothing at all. Now the third turn failure in a row of a bot is one WARNING (the bot, the reason,
the last error on one line, what to do), then nothing while it lasts, and one INFO when a turn of it
succeeds again.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from roots import LogCapture, make_root

from hermes_actors import Gateway, TurnFailed
from hermes_actors.core import outcomes
from hermes_actors.core.failing_turns import SAY_AFTER, TURN_FAILURES, advice, turn_ended
from hermes_actors.core.reasons import VOCABULARY
from hermes_actors.core.spell import Spell
from hermes_actors.messages import Outcome, Turn

ROOT = Path("/srv/my hermes")


# ── the rule: Spell ─────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("steps", "say_at", "said"),
    [
        ("FFFFS", 3, [False, False, True, False, 4]),  # said at the third, nothing after, its end with the count
        ("FFSFFFS", 3, [False, False, 0, False, False, True, 3]),  # a success before the threshold ends nothing said
        ("FSFS", 1, [True, 1, True, 1]),  # threshold 1 (the journal's): each spell said at its first failure
        ("SS", 3, [0, 0]),
        ("FFF", 0, [True, False, False]),  # a threshold below 1 is 1
    ],
)
def test_a_spell_is_said_once_at_its_threshold_and_its_end_once(steps: str, say_at: int, said: list[object]) -> None:
    spell = Spell()
    got: list[object] = []
    for step in steps:
        if step == "F":
            spell, say = spell.failed(say_at)
            got.append(say)
        else:
            spell, ended = spell.landed()
            got.append(ended)
            assert spell == Spell()
    assert got == said


# ── which outcomes count: turn_ended ────────────────────────────────────────


def _failed(reason: str, error: str = "HTTP 500: Internal Server Error") -> Outcome:
    return outcomes.failed("d" * 32, "@carol", error, reason)


_REPLIED = outcomes.from_reply("d" * 32, "@carol", "hi")
_SILENT = outcomes.from_reply("d" * 32, "@carol", "[SILENT]")
_AMBIGUOUS = outcomes.ambiguous("d" * 32, "@carol", "The gateway stopped during the turn.")
_CANCELLED = outcomes.cancelled("d" * 32, "@carol")


def _run(sequence: list[Outcome], *, root: Path = ROOT) -> tuple[Spell, list[tuple[str, str]]]:
    spell = Spell()
    lines: list[tuple[str, str]] = []
    for outcome in sequence:
        spell, said = turn_ended(spell, outcome, handle="carol", profile="carol", root=root, hermes=True)
        if said is not None:
            lines.append((said.level, said.text))
    return spell, lines


@pytest.mark.parametrize(
    ("sequence", "levels", "failures"),
    [
        ([_failed("provider_server_error")] * 2, [], 2),  # below the threshold: nothing said yet
        ([_failed("provider_server_error")] * 5, ["WARNING"], 5),  # once, not per DM
        ([_failed("provider_server_error")] * 4 + [_REPLIED], ["WARNING", "INFO"], 0),
        ([_failed("missing_config")] * 3 + [_SILENT], ["WARNING", "INFO"], 0),  # silence is a turn that ran
        ([_failed("unknown"), _failed("delivery_timeout"), _failed("runtime_offline")], ["WARNING"], 3),
        ([_failed("provider_server_error")] * 2 + [_REPLIED] + [_failed("provider_server_error")] * 2, [], 2),
        # refusals and DMs that never ran neither count nor end the spell
        ([_failed("provider_server_error"), _failed("target_busy"), _failed("loop_guard"), _CANCELLED,
          _failed("queued_expired"), _AMBIGUOUS, _failed("provider_server_error")], [], 2),
        ([_failed("target_busy")] * 5 + [_CANCELLED] * 3 + [_AMBIGUOUS] * 3, [], 0),
        ([_failed("provider_server_error")] * 3 + [_failed("target_busy"), _CANCELLED, _AMBIGUOUS, _REPLIED],
         ["WARNING", "INFO"], 0),
    ],
)
def test_which_outcomes_count_as_a_bots_failing_turns(sequence: list[Outcome], levels: list[str],
                                                      failures: int) -> None:
    spell, lines = _run(sequence)
    assert [level for level, _ in lines] == levels
    assert spell.failures == failures


def test_the_counted_reasons_are_the_runners_failures_not_refusals() -> None:
    assert TURN_FAILURES <= VOCABULARY
    not_counted = VOCABULARY - TURN_FAILURES
    assert not_counted == {"target_busy", "loop_guard", "cancelled", "queued_expired", "agent_blocked"}


def test_the_warning_names_the_bot_reason_last_error_on_one_line_and_what_to_do() -> None:
    error = "HTTP 500: Internal Server Error\n  upstream said: " + "x " * 300
    _, lines = _run([_failed("provider_server_error", "first")] * 2 + [_failed("provider_server_error", error)]
                    + [_failed("provider_server_error")] * 3 + [_REPLIED])
    (level, warning), (info_level, info) = lines
    assert level == "WARNING" and info_level == "INFO"
    assert warning.startswith("@carol's turns keep failing: 3 in a row, the last provider_server_error "
                              "(HTTP 500: Internal Server Error upstream said: x x")
    assert "\n" not in warning and "first" not in warning and len(warning) < 600
    assert "`hermes -p carol model`" in warning and "`hermes-actors doctor --root '/srv/my hermes'`" in warning
    assert info == "@carol's turns run again after 6 failures"


@pytest.mark.parametrize(
    ("reason", "needle"),
    [
        ("provider_auth_or_access", "API key"),
        ("provider_quota_limit", "quota or credit"),
        ("provider_rate_limit", "rate-limiting"),
        ("provider_server_error", "check its model and its provider"),
        ("model_unavailable", "check its model and its provider"),
        ("missing_config", "set model.default and its provider in its config.yaml"),
        ("context_overflow", "larger context"),
        ("delivery_timeout", "bot_mode.turn_timeout_seconds"),
        ("runtime_offline", "cannot be reached"),
        ("unknown", "see the error"),
    ],
)
def test_the_advice_follows_the_reasons_family(reason: str, needle: str) -> None:
    text = advice(reason, profile="carol", root=ROOT, hermes=True)
    assert needle in text and "`hermes -p carol model`" in text
    other = advice(reason, profile="carol", root=ROOT, hermes=False)  # a runner of the embedder's: no hermes advice
    assert "hermes -p" not in other and "the runner this gateway was started with" in other


# ── end to end: a Gateway whose runner fails, then succeeds ─────────────────


def test_a_bot_whose_turns_keep_failing_is_said_once_and_once_again_when_they_run(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"alice": {}, "bob": {}, "carol": {}})
    fixed = threading.Event()
    ran: list[str] = []

    def runner(turn: Turn) -> str:
        ran.append(turn.profile)
        if turn.profile == "carol" and not fixed.is_set():
            raise TurnFailed("HTTP 500: Internal Server Error\nrequest id abc", reason="provider_server_error")
        return "ok"

    with LogCapture("INFO") as logs, Gateway(root, runner=runner) as gw:
        def dm(target: str) -> dict[str, object]:
            ack = gw.message_agent(sender="alice", target=target, message="the secret question")
            return gw.wait_outcome(str(ack["delivery_id"]), timeout=30)

        for _ in range(SAY_AFTER - 1):
            assert dm("carol")["reason"] == "provider_server_error"
        assert dm("bob")["status"] == "replied"  # another bot's turns are not carol's
        gw.stats()  # an ask: the Dispatcher handled every outcome before it answers
        assert not logs.matching("turns keep failing"), logs.lines  # two failures: not said yet
        for _ in range(3):
            assert dm("carol")["reason"] == "provider_server_error"
        fixed.set()
        assert dm("carol")["status"] == "replied"
        assert dm("carol")["status"] == "replied"
        gw.stats()
    warnings = [r for r in logs.records if r["level"].name == "WARNING"]
    assert [r["message"] for r in warnings if "turns keep failing" in r["message"]] == [
        r["message"] for r in warnings], warnings  # nothing else warned
    assert len(warnings) == 1, warnings
    warning = warnings[0]["message"]
    assert warning.startswith("@carol's turns keep failing: 3 in a row, the last provider_server_error "
                              "(HTTP 500: Internal Server Error request id abc). "), warning
    assert "`hermes-actors doctor --root" in warning
    again = [r for r in logs.records if r["message"].startswith("@carol's turns run again")]
    assert [(r["level"].name, r["message"]) for r in again] == [("INFO", "@carol's turns run again after 5 failures")]
    assert not any("secret" in line for line in logs.lines)
    assert ran.count("carol") == 5 * 2 + 2  # each failure retried once (provider_server_error): one outcome each


def test_the_docs_show_the_lines_as_they_are_said() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    _, lines = _run([_failed("provider_server_error", "HTTP 500: Internal Server Error")] * 4 + [_REPLIED],
                    root=Path("/home/me/.hermes"))
    assert [level for level, _ in lines] == ["WARNING", "INFO"]  # the example's two lines
    for _, text in lines:
        assert text in docs, text


def test_runs_hermes_counts_a_bot_mode_releases_cli_as_hermes_and_an_embedders_runner_not() -> None:
    from hermes_actors.demo.bots import DemoRunner
    from hermes_actors.facade.options import runs_hermes
    from hermes_actors.local.command_runner import CommandRunner

    class RealHermes:
        real_hermes = True

    assert runs_hermes(None) and runs_hermes(RealHermes())
    assert runs_hermes(CommandRunner(cli="/bin/true"))
    assert not runs_hermes(DemoRunner()) and not runs_hermes(lambda turn: "ok")


def test_turns_of_a_bot_mode_releases_cli_that_keep_failing_get_the_model_advice(tmp_path: Path) -> None:
    """Regression (review): with ``--runner command`` (the CLI of a release with Bot Mode built in) a bot whose
    model answered HTTP 500 every turn was told ``the runner this gateway was started with fails them``: the
    advice for an embedder's runner, not its model's."""
    from hermes_actors.local.command_runner import CommandRunner

    root = make_root(tmp_path, {"alice": {}, "carol": {}})
    cli = tmp_path / "hermes"
    cli.write_text("#!/bin/sh\necho 'Error: HTTP 500: Internal Server Error' >&2\nexit 1\n")
    cli.chmod(0o755)
    with LogCapture("WARNING") as logs, Gateway(root, runner=CommandRunner(cli=str(cli), timeout=60)) as gw:
        for _ in range(SAY_AFTER):
            ack = gw.message_agent(sender="alice", target="carol", message="hi")
            assert gw.wait_outcome(str(ack["delivery_id"]), timeout=60)["reason"] == "provider_server_error"
        gw.stats()  # an ask: the Dispatcher handled every outcome before it answers
    (warning,) = logs.matching("turns keep failing")
    assert "check its model and its provider (`hermes -p carol model`" in warning, warning
    assert "the runner this gateway was started with" not in warning
