"""Commands we print for the user to run (``core.shell``): each word quoted, so the command runs as printed."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from hermes_actors.core.shell import shell_command


@pytest.mark.parametrize(
    ("words", "printed"),
    [
        (("hermes-actors", "serve", "--root", Path("/home/me/.hermes")), "hermes-actors serve --root /home/me/.hermes"),
        (("hermes-actors", "room", "show", "--root", "/srv/my hermes", "my team"),
         "hermes-actors room show --root '/srv/my hermes' 'my team'"),
        (("hermes-actors", "room", "show", "--root", "/r", "it's"), "hermes-actors room show --root /r 'it'\"'\"'s'"),
        (("hermes-actors", "outcome", "--root", "/r", ""), "hermes-actors outcome --root /r ''"),
        (("hermes-actors", "outcome", "--root", "/r;rm -rf ~"), "hermes-actors outcome --root '/r;rm -rf ~'"),
    ],
)
def test_shell_command_quotes_each_word_that_needs_it(words: tuple[object, ...], printed: str) -> None:
    assert shell_command(*words) == printed
    assert shlex.split(printed) == [str(word) for word in words]


def test_shell_command_sets_a_variable_the_shell_reads_as_an_assignment(tmp_path: Path) -> None:
    """``HERMES_HOME='/x y' hermes …``: quoting the whole ``NAME=value`` word would make it the command's name."""
    root = tmp_path / "my hermes"
    line = shell_command("sh", "-c", 'printf %s "$HERMES_HOME"', env={"HERMES_HOME": root})
    assert line.startswith(f"HERMES_HOME={shlex.quote(str(root))} sh -c "), line
    ran = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True, timeout=30)
    assert ran.stdout == str(root)  # pasted into a shell, it runs as printed
