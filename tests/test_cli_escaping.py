"""Terminal control characters in what the CLI prints: a command printed to run is quoted to run as printed
(``$'…'``) and shows no control character."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from roots import make_root

from hermes_actors.cli.main import main

_ESC_ROOT = "root\x1b[7mX"  # a root whose path holds an ESC sequence (reverse video)
_RAW = ("\x1b", "\x07")


def _shown(path: Path) -> str:
    return str(path).replace("\x1b", "\\x1b")


def _no_raw_control(text: str) -> None:
    assert not any(raw in text for raw in _RAW), ascii(text)


def test_status_prints_a_start_command_that_runs_as_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI review): status said `start one: hermes-actors serve --root '…/root\\x1b[7mX'`: safe to
    show, but pasted it names another root (a backslash, an x, ...), not the one with the ESC. The word is ANSI-C
    quoted now, which the shell reads back as the root's path."""
    root = make_root(tmp_path, name=_ESC_ROOT)
    assert main(["status", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    _no_raw_control(out)
    command = out.split("(start one: ", 1)[1].split(")\n", 1)[0]
    assert command == f"hermes-actors serve --root $'{_shown(root)}'", command
    argv = subprocess.run(["bash", "-c", command.replace("hermes-actors", 'printf "%s\\0"', 1)], capture_output=True,
                          check=True, timeout=30).stdout.decode().split("\0")[:-1]
    assert argv == ["serve", "--root", str(root)]
