"""The ``hermes-actors`` console script: the command line, loaded where a Ctrl-C is answered as the command's.

Importing the command line takes most of the command's first quarter second. A Ctrl-C meanwhile ended the
process with a ``KeyboardInterrupt`` traceback from whichever import it landed in, killed by SIGINT; it now ends
it as a Ctrl-C once the command runs does: exit 130, without a word. (One still earlier, while Python starts or
imports this package and loguru, before any code of ours can answer it, is Python's: a traceback.)
"""

from __future__ import annotations

import signal

from hermes_actors.ops.stop_signals import signal_exit_code

__all__ = ["main"]


def main() -> int:
    """Entry point of the console script: :func:`hermes_actors.cli.main.main` on the process's arguments.

    Returns:
        The command's exit code; 130 for a Ctrl-C before the command line was loaded.
    """
    try:
        from hermes_actors.cli.main import main as run_command
    except KeyboardInterrupt:
        return signal_exit_code(signal.SIGINT)
    return run_command()
