"""The seed-design baseline: a small, documented model of the mechanism we replace.

See :mod:`bench.baseline.model` for what is modelled and why it is faithful in
the parts that cost time (subprocess per delivery, 100 ms flock polling, 250 ms
reply-file polling), and :mod:`bench.baseline.relay` for the relay path
(envelope files, a polling Desktop drain, the 250 ms reply waiter).
"""

from bench.baseline.model import LOCK_POLL_S, REPLY_POLL_S, BaselineGateway, wait_reply_file
from bench.baseline.relay import DRAIN_POLL_S, BaselineRelay

__all__ = ["DRAIN_POLL_S", "LOCK_POLL_S", "REPLY_POLL_S", "BaselineGateway", "BaselineRelay", "wait_reply_file"]
