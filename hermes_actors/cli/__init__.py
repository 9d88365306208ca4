"""The `hermes-actors` command line."""

from hermes_actors.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
