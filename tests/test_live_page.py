"""The live page in a real headless browser (Debian's chromium + chromium-driver, installed by ``make browser``).

Load the page, send DMs, see them appear: the roster, a DM in flight while its turn
runs, then every outcome row and the latency chart. Skips, saying why, without
selenium, chromium or chromedriver. Set ``HERMES_ACTORS_SCREENSHOT=path.png`` to
keep a screenshot of the page with the DMs shown (docs/live-page.png is one).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from relay_helpers import remote_row, seed_write_json, write_roster_file
from roots import RecordingRunner, body_of, held_on, send_dm, start_gateway

from hermes_actors import Gateway
from hermes_actors.ops.http_config import HttpSettings

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the [browser] extra)")
pytest.importorskip("prometheus_client", reason="the [ops] extra (prometheus_client) is not installed")

from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from hermes_actors.ops.http_server import OpsHttpServer  # noqa: E402

WAIT = 60  # seconds: a loaded 2-core machine starts chromium slowly


def _binary(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium = _binary("chromium", "chromium-browser", "google-chrome")
    driver_path = _binary("chromedriver", "chromium-driver")
    if chromium is None or driver_path is None:
        pytest.skip(f"no headless browser: chromium={chromium}, chromedriver={driver_path} "
                    "(`make browser` installs Debian's chromium and chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
    except WebDriverException as exc:
        pytest.skip(f"chromium could not start under chromedriver: {exc.msg}")
    try:
        yield driver
    finally:
        driver.quit()


def test_live_page_shows_dms_as_they_happen(root: Path, gateways: list[Gateway], browser: Any,
                                            tmp_path: Path) -> None:
    release = threading.Event()

    def behave(turn: Any) -> str:
        body = body_of(turn.content)
        if body == "hold":
            assert release.wait(WAIT), "the test never released the held turn"
        return f"ok: {body}"

    gw = start_gateway(gateways, root, runner=RecordingRunner(behave))
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0), stream_interval=0.2) as server:
        browser.get(server.url)
        wait = WebDriverWait(browser, WAIT)
        wait.until(ec.text_to_be_present_in_element((By.ID, "conn-state"), "live"))
        for handle in ("hermes", "alice", "bob", "carol"):
            wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f'#roster tr[data-handle="{handle}"]')))

        held = send_dm(gw, "hold", target="carol", sender="alice")
        wait.until(ec.text_to_be_present_in_element((By.ID, "in-flight-count"), "1"))
        assert not browser.find_elements(By.CSS_SELECTOR, f'#outcomes tr[data-delivery-id="{held}"]')

        quick = [send_dm(gw, f"note {n}", target="bob", sender="alice") for n in range(3)]
        release.set()
        # One lookup each that names the status: the table is re-rendered as outcomes stream in, so a
        # row found a moment earlier may be gone (a stale element) by the time it is read again.
        for delivery_id in [*quick, held]:
            wait.until(ec.presence_of_element_located(
                (By.CSS_SELECTOR, f'#outcomes tr[data-delivery-id="{delivery_id}"][data-status="replied"]')))
        wait.until(ec.text_to_be_present_in_element(
            (By.CSS_SELECTOR, f'#outcomes tr[data-delivery-id="{held}"]'), "@alice → @carol"))
        wait.until(ec.text_to_be_present_in_element((By.ID, "latency-n"), "4"))
        assert "p50" in browser.find_element(By.ID, "latency-summary").text
        wait.until(ec.text_to_be_present_in_element((By.ID, "in-flight-count"), "0"))

        shot = Path(os.environ.get("HERMES_ACTORS_SCREENSHOT") or tmp_path / "live-page.png")
        assert browser.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_live_page_with_a_token_opens_from_the_token_link(root: Path, gateways: list[Gateway], browser: Any) -> None:
    gw = start_gateway(gateways, root)
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0, "page-token"), stream_interval=0.2) as server:
        browser.get(server.url)
        assert "unauthorized" in browser.find_element(By.TAG_NAME, "body").text
        browser.get(server.url + "?token=page-token")  # → an HttpOnly cookie, redirected to /
        wait = WebDriverWait(browser, WAIT)
        wait.until(ec.url_to_be(server.url))
        wait.until(ec.text_to_be_present_in_element((By.ID, "conn-state"), "live"))  # /events got the cookie
        delivery_id = send_dm(gw, "with a token")
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f'#outcomes tr[data-delivery-id="{delivery_id}"]')))


def test_live_page_shows_a_room_appear_and_settle(root: Path, gateways: list[Gateway], browser: Any) -> None:
    release = threading.Event()

    def behave(turn: Any) -> str:
        if not turn.session.startswith("Group: "):
            return "ok"
        assert release.wait(WAIT), "the test never released the member turns"
        return "On it." if turn.profile == "alice" else "[SILENT]"

    gw = start_gateway(gateways, root, runner=RecordingRunner(behave))
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0), stream_interval=0.2) as server:
        browser.get(server.url)
        wait = WebDriverWait(browser, WAIT)
        wait.until(ec.text_to_be_present_in_element((By.ID, "conn-state"), "live"))
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, "#rooms tbody"), "no rooms"))

        room = gw.create_room("launch", ["alice", "bob"])
        row = f'#rooms tr[data-room-id="{room["room_id"]}"]'
        # the rows are rebuilt at each status refresh: read them through waits, never a kept element
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, row), "@alice, @bob"))
        wait.until(ec.text_to_be_present_in_element((By.ID, "rooms-count"), "1"))

        assert gw.room_send("launch", "user", "What do we need for Friday?")["status"] == "queued"
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f'{row}[data-state="busy"]')))
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, f"{row} td.messages"), "1"))
        release.set()
        assert gw.wait_room_idle("launch", timeout=WAIT) == "idle"
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, f'{row}[data-state="idle"]')))
        wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, f"{row} td.messages"), "2"))
        assert "What do we need" not in browser.find_element(By.TAG_NAME, "body").text  # no message text shown
        assert not browser.find_elements(By.CSS_SELECTOR, "#outcomes tr[data-delivery-id]")  # rooms are no DMs

        gw.disband_room("launch")
        wait.until(ec.invisibility_of_element_located((By.CSS_SELECTOR, row)))
        wait.until(ec.text_to_be_present_in_element((By.ID, "rooms-count"), "0"))


def test_live_page_tells_a_remote_agent_from_a_local_one_of_the_same_handle(
        root: Path, gateways: list[Gateway], browser: Any) -> None:
    """``@bob`` here and ``@bob on mini`` are two agents: each row shows its own state and DMs in flight, and an
    outcome names the agent as the CLI does. The page also asks for no favicon.ico (a 404 in the console)."""
    release = threading.Event()
    write_roster_file(root, [remote_row("bob", "mini", online=True), remote_row("hermes", "mini", online=True)])
    gw = start_gateway(gateways, root, runner=RecordingRunner(held_on("hold", release)), connection_id="alpha")
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0), stream_interval=0.2) as server:
        browser.get(server.url)
        wait = WebDriverWait(browser, WAIT)
        wait.until(ec.text_to_be_present_in_element((By.ID, "conn-state"), "live"))
        wait.until(lambda _: len(browser.find_elements(By.CSS_SELECTOR, '#roster tr[data-handle="bob"]')) == 2)

        def rows() -> Any:
            """[state, in flight] of the local bob's row and of mini's: read in one script (the table is
            rebuilt at each status refresh), each row found by its "where" column."""
            return browser.execute_script(
                "const rows = [...document.querySelectorAll('#roster tr[data-handle=\"bob\"]')];"
                "return ['local', 'mini'].map(w => { const r = rows.find(r => r.cells[1].textContent === w);"
                " return r ? [r.cells[2].textContent, r.cells[3].textContent] : null; });")

        held = send_dm(gw, "hold", target="bob", sender="alice")
        wait.until(lambda _: rows()[0] == ["running", "1"])
        assert rows()[1] == ["online", "0"]  # not the local bob's turn, not its count

        ack = gw.message_agent(sender="alice", target="bob@mini", message="ping")
        assert ack["status"] == "queued", ack
        relayed = str(ack["delivery_id"])
        wait.until(lambda _: rows() == [["running", "1"], ["online", "1"]])

        seed_write_json(root / "bot_relay" / "replies" / f"{relayed}.json",
                        {"id": relayed, "at": int(time.time()), "reply": "pong", "error": "", "reason": ""})
        release.set()
        wait.until(ec.text_to_be_present_in_element(
            (By.CSS_SELECTOR, f'#outcomes tr[data-delivery-id="{relayed}"]'), "@alice → @bob on mini"))
        wait.until(ec.text_to_be_present_in_element(
            (By.CSS_SELECTOR, f'#outcomes tr[data-delivery-id="{held}"]'), "@alice → @bob"))
        wait.until(lambda _: rows() == [["idle", "0"], ["online", "0"]])
        assert "on mini" not in browser.find_element(By.CSS_SELECTOR, f'#outcomes tr[data-delivery-id="{held}"]').text

    assert browser.find_element(By.CSS_SELECTOR, 'link[rel="icon"]').get_attribute("href").startswith("data:")
    assert not [e for e in browser.get_log("browser") if "favicon" in str(e.get("message"))]
