"""The seed-design baseline: a small, documented model of the mechanism we replace.

See :mod:`bench.baseline.model` for what is modelled and why it is faithful in
the parts that cost time (subprocess per delivery, 100 ms flock polling, 250 ms
reply-file polling).
"""

from bench.baseline.model import LOCK_POLL_S, REPLY_POLL_S, BaselineGateway, wait_reply_file

__all__ = ["LOCK_POLL_S", "REPLY_POLL_S", "BaselineGateway", "wait_reply_file"]
