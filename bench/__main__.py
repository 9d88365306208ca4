"""``python -m bench`` — the same as ``hermes-actors bench``."""

import sys

from bench.harness import main

sys.exit(main(prog="python -m bench"))
