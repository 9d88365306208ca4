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

__all__ = ["PeerCliTransport"]

# What argparse says when the installed hermes has no `peer` subcommand (hermes-agent 0.19).
_NO_PEER_COMMAND = "invalid choice: 'peer'"


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
            text = (f"The hermes CLI at {self.cli!r} has no `peer` command (hermes-agent 0.19 has no Bot Mode "
                    f"peers), so peer '{route.peer}' cannot be reached this way; the message was NOT delivered. "
                    "Run both gateways on one Redis (bot_mode.transport) or use a hermes release with Bot Mode.")
            return outcomes.failed(delivery.delivery_id, route.label, text, "runtime_offline")
        detail = (proc.stderr or proc.stdout).strip()[-2000:] or f"exit status {proc.returncode}"
        return outcomes.failed(delivery.delivery_id, route.label, f"peer dm failed: {detail}")
