"""End to end with the real hermes-agent (0.19), offline: bots DM each other through our plugin and host.

Each test starts what a user starts — ``hermes -p alice chat -c "Bot Chat" -q …``,
``hermes-actors serve --root R`` or ``hermes gateway run`` — against the fake
model on 127.0.0.1 (tests/fake_model.py), whose script (:func:`hermes_e2e.bot_script`)
makes a bot call ``message_agent`` when its turn says ``DM <target>: <text>``.
Assertions are on what the fake model received (per profile, read from each
profile's SOUL.md marker) and on the profiles' ``state.db``.

The hosts run the real Hermes by default (``serve``: CLI turns; inside the
hermes gateway: warm turns through its API server) and wake each sender with the
outcome (``bot_mode.wake_sender: auto``); assertions on the wake-up are marked
``WAKE``. The DM round trip, warm and with CLI turns, is measured by
``python -m bench.hermes_round_trip`` (timings stay out of the tests).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_model import FakeModel, ToolCall, last_user_text, message_agent_call, profile_of
from hermes_e2e import (
    API_KEY,
    FLOW_TIMEOUT,
    POLL_SECONDS,
    START_TIMEOUT,
    E2ERoot,
    Processes,
    bot_chat_messages,
    bot_script,
    dm_text,
    free_port,
    journal_files,
    log_tail,
    make_e2e_root,
    run_cli_turn,
    start_cli_turn,
    start_hermes_gateway,
    start_serve,
    tool_result_of,
    turn_of,
    wake_calls,
)
from hermes_fixtures import locate_hermes_cli

from actors.testkit import await_condition
from hermes_actors.core.targets import NOT_BOT_CHAT_TEXT
from hermes_actors.hermes.submit import fetch_outcome, fetch_status, ping, submit_dm

_CLI = locate_hermes_cli()
if _CLI is None:
    pytest.skip("hermes-agent is not installed (no hermes CLI beside python or on PATH; "
                "`make test` installs the `hermes` extra, or set HERMES_ACTORS_HERMES_CLI)", allow_module_level=True)

pytestmark = pytest.mark.timeout(900)  # several real hermes processes per test on a loaded 2-core machine


@pytest.fixture
def model() -> Iterator[FakeModel]:
    from hermes_e2e import bot_script

    fake = FakeModel(bot_script).start()
    yield fake
    fake.stop()


@pytest.fixture
def procs() -> Iterator[Processes]:
    started = Processes()
    yield started
    started.close()


@pytest.fixture
def e2e(tmp_path: Path, model: FakeModel) -> E2ERoot:
    """A root with alice and bob, Bot-Mode-enabled with ``hermes-actors enable`` (no host yet)."""
    assert _CLI is not None
    root = make_e2e_root(tmp_path, model, ["alice", "bob"], _CLI)
    root.enable()
    return root


def ack_of(model: FakeModel, profile: str, text: str) -> dict[str, Any]:
    """The ``message_agent`` answer ``profile``'s turn on ``text`` got (as the model received it)."""
    call = model.wait_for(tool_result_of(profile, text), FLOW_TIMEOUT)
    assert call.tool_result is not None
    answer: dict[str, Any] = json.loads(call.tool_result)
    return answer


def wait_bot_chat_has(home: Path, message: tuple[str, str]) -> list[tuple[str, str]]:
    """The Bot Chat of ``home`` once it holds ``message``."""
    return await_condition(lambda: message in bot_chat_messages(home) and bot_chat_messages(home),
                           timeout=FLOW_TIMEOUT, interval=POLL_SECONDS,
                           message=f"{message!r} in {home.name}'s Bot Chat")


# ── refusals (no host needed) ───────────────────────────────────────────────


def test_without_a_host_the_tool_refuses_runtime_offline_and_nothing_is_queued(
    e2e: E2ERoot, model: FakeModel
) -> None:
    text = "DM bob: is anyone hosting us?"
    stdout = run_cli_turn(e2e, "alice", text)
    answer = ack_of(model, "alice", text)
    assert answer["reason"] == "runtime_offline"
    assert f"hermes-actors serve --root {e2e.root}" in answer["error"] and "NOT sent" in answer["error"]
    assert "runtime_offline" in stdout  # the bot's own reply relays the refusal to the user
    assert journal_files(e2e.root) == []  # nothing queued: no journal, outbox or live-delivery entry
    assert model.calls_where(lambda c: c.profile == "bob") == []
    assert bot_chat_messages(e2e.home("bob")) == []


def test_a_dm_from_a_session_that_is_not_bot_chat_is_refused(e2e: E2ERoot, model: FakeModel) -> None:
    text = "DM bob: psst, from my scratch session"
    run_cli_turn(e2e, "alice", text, session=None)  # a plain `hermes chat -q`: a new, untitled session
    answer = ack_of(model, "alice", text)
    # the gate answers before anything else: not the runtime_offline refusal, though no host runs
    assert answer["error"] == NOT_BOT_CHAT_TEXT
    assert journal_files(e2e.root) == []
    assert bot_chat_messages(e2e.home("alice")) == []  # the scratch turn is not in her Bot Chat


# ── the round trip with `hermes-actors serve` and CLI turns ─────────────────


def test_round_trip_with_serve_and_cli_turns(e2e: E2ERoot, model: FakeModel, procs: Processes) -> None:
    start_serve(procs, e2e)
    text = "DM bob: hi bob, what is the build status?"
    bob_reads = dm_text("Alice", "alice", "hi bob, what is the build status?")
    # bob's turn waits in the model until alice's own CLI turn has ended: a user's CLI turn on
    # her Bot Chat is outside our one-turn-per-bot lock (docs/hermes.md), her wake-up is not
    bob_turn = model.hold(turn_of("bob", bob_reads))
    alice = start_cli_turn(procs, e2e, "alice", text)

    ack = ack_of(model, "alice", text)
    assert ack["status"] == "queued" and ack["to"] == "@bob", ack
    held = bob_turn.wait_entered(FLOW_TIMEOUT)  # bob's real turn, started by the host, reads the signed DM
    assert held.platform == "cli"
    assert alice.wait(timeout=FLOW_TIMEOUT) == 0
    bob_turn.release()

    # WAKE: alice's Bot Chat gets the outcome as a new turn whose user message is exactly its text
    wake_text = "Reply from @bob: bob got: " + bob_reads
    wake = model.wait_for(turn_of("alice", wake_text), FLOW_TIMEOUT, answered=True)
    assert wake.messages[-1] == {"role": "user", "content": wake_text}
    alice_chat = wait_bot_chat_has(e2e.home("alice"), ("assistant", f"alice noted: {wake_text}"))
    assert [m for m in alice_chat if m[0] == "user"] == [("user", text), ("user", wake_text)]
    assert ("assistant", f"bob got: {bob_reads}") in bot_chat_messages(e2e.home("bob"))
    assert len(wake_calls(model, "alice", wake_text)) == 1
    assert model.overlaps == []


# ── kill -9 of the host mid-delivery ────────────────────────────────────────


def test_host_killed_mid_delivery_gives_one_outcome_and_one_wake(
    e2e: E2ERoot, model: FakeModel, procs: Processes
) -> None:
    host = start_serve(procs, e2e, name="serve-1")
    bob_reads = dm_text("Alice", "alice", "survive this")
    bob_turn = model.hold(turn_of("bob", bob_reads))
    ack = submit_dm(e2e.root, "alice", "bob", "survive this", hop=1)  # what alice's message_agent sends
    assert ack["status"] == "queued", ack
    bob_turn.wait_entered(FLOW_TIMEOUT)

    procs.kill_group(host)  # SIGKILL to the host and the bob turn it started
    assert host.wait(timeout=60) != 0
    bob_turn.release()  # the held request's client is gone; the model drops it
    start_serve(procs, e2e, name="serve-2")

    outcome = fetch_outcome(e2e.root, ack["delivery_id"], wait=FLOW_TIMEOUT, timeout=FLOW_TIMEOUT + 30)
    assert outcome["status"] in ("replied", "ambiguous"), outcome  # never lost, never "pending"
    assert outcome["delivery_id"] == ack["delivery_id"]
    # WAKE: alice is woken with that one outcome
    model.wait_for(turn_of("alice", outcome["text"]), FLOW_TIMEOUT, answered=True)

    # a later DM's wake-up is the marker: alice's turns run one at a time, in order
    later = submit_dm(e2e.root, "alice", "bob", "after the restart", hop=1)
    assert later["status"] == "queued", later
    later_reads = dm_text("Alice", "alice", "after the restart")
    model.wait_for(turn_of("alice", f"Reply from @bob: bob got: {later_reads}"), FLOW_TIMEOUT, answered=True)
    assert fetch_outcome(e2e.root, ack["delivery_id"]) == outcome  # the same one outcome
    assert len(wake_calls(model, "alice", outcome["text"])) == 1
    first_wakes = model.calls_where(lambda c: c.profile == "alice" and c.tool_result is None
                                    and c.user_text.startswith(("Reply from @bob", "Delivery to @bob"))
                                    and "after the restart" not in c.user_text)
    assert len(first_wakes) == 1, [c.user_text for c in first_wakes]


# ── hosted inside `hermes gateway run`, warm turns ──────────────────────────


@pytest.fixture(scope="module")
def warm_model() -> Iterator[FakeModel]:
    from hermes_e2e import bot_script

    fake = FakeModel(bot_script).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory, warm_model: FakeModel) -> Iterator[E2ERoot]:
    """One hermes gateway for the warm tests: our actors hosted inside it, its API server on a free port.

    ``bot_mode.max_hops`` is 1: a bot's DM is hop 1, a DM sent from inside the turn it starts is hop 2.
    """
    assert _CLI is not None
    e2e = make_e2e_root(tmp_path_factory.mktemp("warm"), warm_model, ["alice", "bob", "carol", "dave", "erin"], _CLI)
    port = free_port()
    report = e2e.enable("--gateway", "--port", str(port))
    assert "multiplex_profiles" in report
    e2e.set_bot_mode(max_hops=1)
    started = Processes()
    try:
        start_hermes_gateway(started, e2e, port)
        yield e2e
    finally:
        started.close()


def test_round_trip_hosted_in_the_hermes_gateway_with_warm_turns(
    warm: E2ERoot, warm_model: FakeModel, procs: Processes
) -> None:
    model = warm_model
    text = "DM bob: warm hello"
    bob_reads = dm_text("Alice", "alice", "warm hello")
    bob_turn = model.hold(turn_of("bob", bob_reads))
    alice = start_cli_turn(procs, warm, "alice", text)  # the user's own turn; bob's and the wake-up run warm

    ack = ack_of(model, "alice", text)
    assert ack["status"] == "queued" and ack["to"] == "@bob", ack
    held = bob_turn.wait_entered(FLOW_TIMEOUT)
    # a warm turn through the gateway's API server, not a CLI process. (Only bob's fresh session tells:
    # hermes keeps a session's system prompt from its first turn, and alice's began in the CLI. The host
    # has one runner for every bot, so alice's wake-up runs warm too.)
    assert held.platform == "api_server"
    assert alice.wait(timeout=FLOW_TIMEOUT) == 0
    bob_turn.release()

    wake_text = f"Reply from @bob: bob got: {bob_reads}"  # WAKE
    wake = model.wait_for(turn_of("alice", wake_text), FLOW_TIMEOUT, answered=True)
    assert wake.messages[-1] == {"role": "user", "content": wake_text}
    alice_chat = wait_bot_chat_has(warm.home("alice"), ("assistant", f"alice noted: {wake_text}"))
    assert ("user", text) in alice_chat
    assert ("assistant", f"bob got: {bob_reads}") in bot_chat_messages(warm.home("bob"))
    assert len(wake_calls(model, "alice", wake_text)) == 1
    assert [p for p, _ in model.overlaps if p in ("alice", "bob")] == []


def test_doctor_without_the_gateways_api_server_key_says_its_api_server_runs(warm: E2ERoot) -> None:
    """Regression: the gateway was started with API_SERVER_KEY in its environment, not in the root's .env: hermes
    0.19 starts its API server from the config.yaml block with that key (warm turns run), yet doctor, from a shell
    without the variable, warned that hermes refuses to start it and every turn runs with the CLI."""
    assert not (warm.root / ".env").exists()
    port = yaml.safe_load((warm.root / "config.yaml").read_text(encoding="utf-8"))["platforms"]["api_server"][
        "extra"]["port"]
    shell = {k: v for k, v in warm.env.items() if not k.startswith("API_SERVER_")}
    done = subprocess.run([sys.executable, "-c", "from hermes_actors.cli.main import main; main()", "doctor",
                           "--root", str(warm.root), "--json"], env=shell, capture_output=True, text=True,
                          timeout=120, check=False)
    warm_check = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "warm turns")
    assert warm_check["level"] == "ok", warm_check
    assert f"through the hermes API server 127.0.0.1:{port}" in warm_check["detail"], warm_check
    assert "the hermes gateway took it from the environment it was started with" in warm_check["detail"], warm_check


def _assert_a_dm_right_after_the_start_runs_warm(e2e: E2ERoot, model: FakeModel) -> None:
    """alice DMs bob just after the gateway's start: bob's turn runs through its API server (warm, not a CLI
    process) and his reply wakes alice."""
    bob_reads = dm_text("Alice", "alice", "right after the start")
    bob_turn = model.hold(turn_of("bob", bob_reads))
    ack = submit_dm(e2e.root, "alice", "bob", "right after the start", hop=1)
    assert ack["status"] == "queued", ack
    held = bob_turn.wait_entered(FLOW_TIMEOUT)
    assert held.platform == "api_server"  # warm, through the gateway's API server: not a CLI process
    bob_turn.release()
    model.wait_for(turn_of("alice", f"Reply from @bob: bob got: {bob_reads}"), FLOW_TIMEOUT, answered=True)  # WAKE


def test_with_the_actors_platform_listed_first_a_dm_right_after_the_gateway_start_runs_warm(
    tmp_path: Path, model: FakeModel, procs: Processes
) -> None:
    """Regression (acceptance, hermes 0.19, 2/2): with `platforms.hermes_actors` before `api_server` in config.yaml
    hermes connects our platform first; the actors' runner found no API server and every DM of the next 30-40 s
    ran as a cold `hermes -p bob chat` process. A turn now waits for the gateway's API server and runs warm."""
    assert _CLI is not None
    e2e = make_e2e_root(tmp_path, model, ["alice", "bob"], _CLI)
    port = free_port()
    e2e.enable("--gateway", "--port", str(port))
    e2e.list_actors_first()  # a config.yaml an earlier enable left so, or written by hand
    start_hermes_gateway(procs, e2e, port, api=False)  # the actors answer: its API server may not yet
    _assert_a_dm_right_after_the_start_runs_warm(e2e, model)


def test_with_the_api_server_enabled_by_the_environment_only_a_dm_right_after_the_gateway_start_runs_warm(
    tmp_path: Path, model: FakeModel, procs: Processes
) -> None:
    """hermes 0.19 enables its API server from the environment too (API_SERVER_KEY, API_SERVER_ENABLED) with no
    block in config.yaml: it then connects it after every platform block, ours included, and enable has nothing to
    reorder. A turn right after the start waits for it and runs warm; doctor then says turns run warm."""
    assert _CLI is not None
    e2e = make_e2e_root(tmp_path, model, ["alice", "bob"], _CLI)
    port = free_port()
    e2e.enable("--gateway", "--port", str(port))
    config_path = e2e.root / "config.yaml"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    del config["platforms"]["api_server"]  # the server is the environment's alone: API_SERVER_KEY is set
    config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    # where a user sets it (enable's "to do"); hermes reads the root's .env, not the process environment, for
    # it once it multiplexes profiles
    (e2e.root / ".env").write_text(f"API_SERVER_ENABLED=true\nAPI_SERVER_KEY={API_KEY}\nAPI_SERVER_PORT={port}\n",
                                   encoding="utf-8")
    start_hermes_gateway(procs, e2e, port, api=False)  # the actors answer: its API server may not yet
    log = (e2e.logs / "hermes-gateway.log").read_text(encoding="utf-8", errors="replace")
    assert "Connecting to api_server" not in log.split("Connecting to hermes_actors", 1)[0], log[-3000:]
    _assert_a_dm_right_after_the_start_runs_warm(e2e, model)
    done = e2e.hermes_actors("doctor", "--root", str(e2e.root), "--json")
    warm_check = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "warm turns")
    assert warm_check["level"] == "ok" and f"127.0.0.1:{port}" in warm_check["detail"], warm_check


def test_with_the_api_server_enabled_by_the_process_environment_only_turns_run_with_the_cli_at_once(
    tmp_path: Path, model: FakeModel, procs: Processes
) -> None:
    """Regression: hermes 0.19, multiplexing profiles, reads API_SERVER_ENABLED / API_SERVER_KEY / API_SERVER_PORT
    from the root's .env only, not from the environment `hermes gateway run` was started with: set only there, it
    starts no API server. hermes-actors read both, so the gateway hosting the actors had its turns wait for that
    server (up to 30 s) and doctor said nothing of it. Now the host runs its turns with the CLI from its start,
    and doctor says why."""
    assert _CLI is not None
    e2e = make_e2e_root(tmp_path, model, ["alice", "bob"], _CLI)
    port = free_port()
    e2e.enable("--gateway", "--port", str(port))
    config_path = e2e.root / "config.yaml"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    del config["platforms"]["api_server"]
    config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    assert not (e2e.root / ".env").exists()
    e2e.env.update({"API_SERVER_ENABLED": "true", "API_SERVER_PORT": str(port)})  # API_SERVER_KEY is set already
    gateway = start_hermes_gateway(procs, e2e, port, api=False)
    pong = ping(e2e.root)
    assert pong is not None and pong.get("pid") == gateway.pid and pong.get("turns_via") == "cli", pong
    bob_reads = dm_text("Alice", "alice", "no API server")
    bob_turn = model.hold(turn_of("bob", bob_reads))
    ack = submit_dm(e2e.root, "alice", "bob", "no API server", hop=1)
    assert ack["status"] == "queued", ack
    assert bob_turn.wait_entered(FLOW_TIMEOUT).platform == "cli"
    bob_turn.release()
    model.wait_for(turn_of("alice", f"Reply from @bob: bob got: {bob_reads}"), FLOW_TIMEOUT, answered=True)  # WAKE
    from hermes_actors.hermes.api_client import ApiServer
    from hermes_actors.hermes.select import probe_api_server

    assert not probe_api_server(ApiServer("127.0.0.1", port, API_KEY))  # hermes started none (its turns ran since)
    done = e2e.hermes_actors("doctor", "--root", str(e2e.root), "--json")
    warm_check = next(c for c in json.loads(done.stdout)["checks"] if c["name"] == "warm turns")
    assert warm_check["level"] == "warn", warm_check
    assert "API_SERVER_ENABLED and API_SERVER_KEY are set in the environment but not in the root's .env" in \
        warm_check["detail"] and str(e2e.root / ".env") in warm_check["fix"], warm_check


def test_nested_dm_is_refused_past_the_hop_limit(warm: E2ERoot, warm_model: FakeModel, procs: Processes) -> None:
    model = warm_model
    text = "DM dave: DM bob: the deep question"
    dave_reads = dm_text("Alice", "alice", "DM bob: the deep question")
    dave_turn = model.hold(turn_of("dave", dave_reads))
    alice = start_cli_turn(procs, warm, "alice", text)

    assert ack_of(model, "alice", text)["status"] == "queued"  # alice → dave is hop 1: within the limit
    dave_turn.wait_entered(FLOW_TIMEOUT)
    assert alice.wait(timeout=FLOW_TIMEOUT) == 0
    dave_turn.release()

    refusal = ack_of(model, "dave", dave_reads)  # dave → bob, sent from inside dave's turn, is hop 2
    assert "error" in refusal and "status" not in refusal, refusal
    assert "Conversation guard" in refusal["error"] and "hop 2" in refusal["error"], refusal
    # WAKE: alice hears dave's reply, which relays the refusal
    wake = model.wait_for(lambda c: c.profile == "alice" and c.tool_result is None
                          and c.user_text.startswith("Reply from @dave: dave sent it: "), FLOW_TIMEOUT, answered=True)
    assert "Conversation guard" in wake.user_text
    assert model.calls_where(lambda c: c.profile == "bob" and "the deep question" in c.user_text) == []


def test_two_dms_to_bob_at_once_run_one_turn_at_a_time(warm: E2ERoot, warm_model: FakeModel) -> None:
    model = warm_model
    first_bodies = {"alice": "first of two", "carol": "second of two"}
    reads = {sender: dm_text(sender.title(), sender, body) for sender, body in first_bodies.items()}
    bob_first = model.hold(lambda c: c.profile == "bob" and c.tool_result is None and c.user_text in reads.values())
    acks: dict[str, dict[str, Any]] = {}
    start = threading.Barrier(2)

    def send(sender: str) -> None:
        start.wait(timeout=30)
        acks[sender] = submit_dm(warm.root, sender, "bob", first_bodies[sender], hop=1)

    threads = [threading.Thread(target=send, args=(s,)) for s in first_bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(a.get("status") == "queued" for a in acks.values()) and len(acks) == 2, acks
    held = bob_first.wait_entered(FLOW_TIMEOUT)

    # marker: a DM accepted after both, to a bot nobody else talks to, runs its turn and wakes its sender;
    # had bob's second DM been started beside the first, its turn would have reached the model by then
    marker = submit_dm(warm.root, "dave", "erin", "marker", hop=1)
    assert marker["status"] == "queued", marker
    model.wait_for(turn_of("dave", "Reply from @erin: erin got: " + dm_text("Dave", "dave", "marker")),
                   FLOW_TIMEOUT, answered=True)
    bob_so_far = model.calls_where(lambda c: c.profile == "bob" and c.user_text in reads.values())
    assert [c.user_text for c in bob_so_far] == [held.user_text]
    bob_first.release()

    for sender in first_bodies:  # WAKE: each sender hears bob's reply to its own DM
        model.wait_for(turn_of(sender, f"Reply from @bob: bob got: {reads[sender]}"), FLOW_TIMEOUT, answered=True)
    bob_turns = model.calls_where(lambda c: c.profile == "bob" and c.user_text in reads.values())
    assert len(bob_turns) == 2
    assert bob_turns[0].answered is not None and bob_turns[0].answered <= bob_turns[1].received
    assert [p for p, _ in model.overlaps if p == "bob"] == []


def test_a_sigterm_of_the_hermes_gateway_during_a_turn_starts_no_queued_turn_and_the_next_start_runs_it(
    tmp_path: Path, procs: Processes
) -> None:
    """Regression (real-hermes soak, 3 of 3 SIGTERMs of `hermes gateway run` hosting the actors while bob's turn ran
    and a DM waited behind it): hermes stops its API server, and only then our platform; the DM's turn started in
    between, warm refused, on the CLI after our submit endpoint closed (its `message_agent` failed "Bot Mode is not
    running", the DM was reported replied), alice's wake ran too, the gateway logged `warm turns stopped (…
    Connection refused) — is hermes gateway run running?` and took 17 s to stop. Now no turn starts once hermes'
    stop began: the running turn finishes, the DM and the wake stay journaled and the next start runs them."""
    assert _CLI is not None
    model = FakeModel(bot_script).start()
    try:
        e2e = make_e2e_root(tmp_path, model, ["alice", "bob", "carol"], _CLI)
        port = free_port()
        e2e.enable("--gateway", "--port", str(port))
        gateway = start_hermes_gateway(procs, e2e, port)
        first_reads, behind_reads = dm_text("Alice", "alice", "first"), dm_text("Carol", "carol", "behind")
        first_turn = model.hold(turn_of("bob", first_reads))
        first = submit_dm(e2e.root, "alice", "bob", "first", hop=1)
        assert first["status"] == "queued", first
        first_turn.wait_entered(FLOW_TIMEOUT)
        behind = submit_dm(e2e.root, "carol", "bob", "behind", hop=1)
        assert behind["status"] == "queued", behind

        hermes_log = e2e.root / "logs" / "gateway.log"
        gateway.send_signal(signal.SIGTERM)  # the gateway process only, as systemd or `kill` would
        await_condition(lambda: "Stopping gateway" in log_tail(hermes_log, 100_000), timeout=START_TIMEOUT,
                        interval=POLL_SECONDS, message="hermes' stop to begin")
        first_turn.release()  # bob's running turn ends during the stop: nothing may start behind it
        assert gateway.wait(timeout=START_TIMEOUT) is not None
        stop_log = log_tail(hermes_log, 100_000)
        assert "warm turns stopped" not in stop_log
        during_the_stop = {c.index for c in model.calls}
        assert model.calls_where(turn_of("bob", behind_reads)) == []
        wake_text = f"Reply from @bob: bob got: {first_reads}"  # WAKE
        assert wake_calls(model, "alice", wake_text) == []

        restarted = start_hermes_gateway(procs, e2e, port)  # the next start runs what the stop kept, once each
        behind_turn = model.wait_for(turn_of("bob", behind_reads), FLOW_TIMEOUT, answered=True)
        wake = model.wait_for(turn_of("alice", wake_text), FLOW_TIMEOUT, answered=True)
        assert behind_turn.index not in during_the_stop and wake.index not in during_the_stop
        outcome = fetch_outcome(e2e.root, behind["delivery_id"], wait=FLOW_TIMEOUT)
        assert (outcome["status"], outcome["reply"]) == ("replied", f"bob got: {behind_reads}"), outcome
        assert len(model.calls_where(turn_of("bob", behind_reads))) == 1
        assert len(wake_calls(model, "alice", wake_text)) == 1
        # carol's wake with bob's reply ends the flow: stopped once it is settled, the gateway has no turn to cut
        await_condition(lambda: fetch_status(e2e.root)["in_flight"] == [], timeout=FLOW_TIMEOUT,
                        interval=POLL_SECONDS, message="every DM and wake settled")
        procs.stop(restarted)
    finally:
        model.stop()


# ── `serve` hosting, a separate hermes gateway running the warm turns ───────


def ping_pong_script(messages: list[dict[str, Any]]) -> str | ToolCall:
    """:func:`bot_script`, except that alice answers every reply of bob's to a PINGPONG with another DM to bob."""
    text = last_user_text(messages)
    if (profile_of(messages) == "alice" and messages[-1].get("role") != "tool"
            and text.startswith("Reply from @bob: ") and "PINGPONG" in text):
        return message_agent_call("bob", "PINGPONG again")
    return bot_script(messages)


def test_a_warm_ping_pong_under_serve_ends_at_the_hop_limit(tmp_path: Path, procs: Processes) -> None:
    """The turns run in the hermes gateway, the actors in serve: serve still knows each warm turn's hop.

    Each wake-up of alice (hop N, the hop of the DM it answers) DMs bob again at hop N+1; with
    ``max_hops: 3`` the DM from her third wake-up is hop 4 and refused ``loop_guard``.
    """
    assert _CLI is not None
    model = FakeModel(ping_pong_script).start()
    try:
        e2e = make_e2e_root(tmp_path, model, ["alice", "bob"], _CLI)
        port = free_port()
        e2e.enable("--gateway", "--port", str(port))
        e2e.keep_actors_out_of_the_gateway()
        e2e.set_bot_mode(max_hops=3)
        start_hermes_gateway(procs, e2e, port, hosts=False)
        serve = start_serve(procs, e2e)  # the host: the gateway's plugin submits to it over the socket
        ack = submit_dm(e2e.root, "alice", "bob", "PINGPONG start", hop=1)
        assert ack["status"] == "queued", ack

        def bob_turns() -> list[Any]:
            return model.calls_where(lambda c: c.profile == "bob" and c.tool_result is None
                                     and c.user_text.startswith(dm_text("Alice", "alice", "PINGPONG")))

        def refused() -> list[Any]:
            assert len(bob_turns()) <= 6, "the ping-pong went on past max_hops: 3 (the warm turns' hop is lost)"
            return model.calls_where(lambda c: c.profile == "alice" and c.tool_result is not None
                                     and "Conversation guard" in c.tool_result)

        last = await_condition(refused, timeout=FLOW_TIMEOUT * 2, interval=POLL_SECONDS,
                               message="alice's DM refused by the conversation guard")[-1]
        assert last.tool_result is not None
        answer = json.loads(last.tool_result)
        assert answer["reason"] == "loop_guard" and "this DM would be hop 4" in answer["error"], answer
        turns = bob_turns()
        assert len(turns) == 3, [c.user_text for c in turns]
        assert {c.platform for c in turns} == {"api_server"}  # warm turns, run by the hermes gateway
        assert (ping(e2e.root) or {}).get("pid") == serve.pid
    finally:
        model.stop()
