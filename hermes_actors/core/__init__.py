"""Pure decisions of Bot Mode: routing (plan_send), the loop guard, outcomes, reasons, recovery, ids, config.

Nothing here starts a thread or touches an actor; most modules are table-tested pure functions.
"""
