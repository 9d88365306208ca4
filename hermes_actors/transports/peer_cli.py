"""The seed's CLI transport to a registered peer gateway (``bot_peers``).

``hermes -p <root profile> peer dm <peer>[/<agent>]`` with the DM on stdin and
the author record in ``HERMES_TURN_AUTHOR``. No local retry: the peer retries
on its own side.
"""

from __future__ import annotations

import os
import subprocess

import orjson

from hermes_actors.core import outcomes
from hermes_actors.core.authors import bot_author_id, local_origin
from hermes_actors.core.targets import PeerRoute
from hermes_actors.local.cli_process import resolve_cli
from hermes_actors.messages import Delivery, Outcome

__all__ = ["PEER_FIX", "PeerCliTransport", "no_peer_command", "peer_command_missing"]

# What argparse says when the installed hermes has no `peer` subcommand (hermes-agent 0.19).
_NO_PEER_COMMAND = "invalid choice: 'peer'"
_PROBE_TIMEOUT = 30.0  # `hermes peer --help` imports hermes: 2–4 s of CPU, more on a loaded machine
PEER_FIX = "Run both gateways on one Redis (bot_mode.transport) or use a hermes release with Bot Mode."


def no_peer_command(cli: str) -> str:
    """Pure: why a ``bot_peers`` DM through ``cli`` cannot be delivered (a failed DM and doctor both say it)."""
    return f"The hermes CLI at {cli!r} has no `peer` command (hermes-agent 0.19 has no Bot Mode peers)"


def peer_command_missing(cli: str) -> bool | None:
    """Whether ``cli`` lacks the ``peer`` command, asked as the transport would find out (``hermes peer --help``).

    Args:
        cli: the hermes executable.

    Returns:
        True when argparse refuses ``peer`` (hermes-agent 0.19), False when the command exists, None when
        ``cli`` did not run or answered otherwise (nothing can be said).
    """
    try:
        proc = subprocess.run([cli, "peer", "--help"], capture_output=True, text=True, encoding="utf-8",
                              errors="replace", timeout=_PROBE_TIMEOUT, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if _NO_PEER_COMMAND in proc.stderr:
        return True
    return False if proc.returncode == 0 else None


class PeerCliTransport:
    """Delivers one DM to a peer through the ``hermes peer dm`` command.

    Args:
        cli: the hermes executable (resolved beside the interpreter, then PATH).
        timeout: seconds before the delivery is ``delivery_timeout``.
    """

    def __init__(self, cli: str | None = None, *, timeout: float = 900.0) -> None:
        self.cli = cli or resolve_cli()
        self.timeout = timeout

    def argv(self, route: PeerRoute) -> list[str]:
        """The command line for ``route``."""
        target = f"{route.peer}/{route.agent}" if route.agent else route.peer
        return [self.cli, "-p", "default", "peer", "dm", target]

    def deliver(self, delivery: Delivery, route: PeerRoute) -> Outcome:
        """Run the transport; never raises (failures are outcomes)."""
        env = dict(os.environ)
        # A peer dm crosses installs: the id names this host, so the peer's own bot of that name stays distinct.
        author = {**delivery.author, "id": bot_author_id(delivery.sender, local_origin())}
        env["HERMES_TURN_AUTHOR"] = orjson.dumps(author).decode()
        try:
            proc = subprocess.run(
                self.argv(route),
                input=delivery.content,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=self.timeout,
                env=env,
                check=False,
            )
        except FileNotFoundError:
            text = f"hermes CLI not found at {self.cli!r}; cannot reach peer '{route.peer}'."
            return outcomes.failed(delivery.delivery_id, route.label, text, "runtime_offline")
        except subprocess.TimeoutExpired:
            text = f"No answer from peer '{route.peer}' within {self.timeout:g}s; it may still be delivered."
            return outcomes.ambiguous(delivery.delivery_id, route.label, text, "delivery_timeout")
        if proc.returncode == 0:
            return outcomes.from_reply(delivery.delivery_id, route.label, proc.stdout.rstrip("\n"))
        if _NO_PEER_COMMAND in proc.stderr:  # argparse refused the command: nothing was sent
            text = (f"{no_peer_command(self.cli)}, so peer '{route.peer}' cannot be reached this way; the message "
                    f"was NOT delivered. {PEER_FIX}")
            return outcomes.failed(delivery.delivery_id, route.label, text, "runtime_offline")
        detail = (proc.stderr or proc.stdout).strip()[-2000:] or f"exit status {proc.returncode}"
        return outcomes.failed(delivery.delivery_id, route.label, f"peer dm failed: {detail}")
