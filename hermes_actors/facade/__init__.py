"""The private parts of the embedding facade (``hermes_actors.gateway.Gateway``) and of the
actor system it starts (``hermes_actors.system.ActorSystem``).

Each module is one composed object or one rule: the checks on what a caller passes in
(``args``), the running state (``lifecycle``), subscribers and live owners given before
``start()`` (``registrations``), the sends a stop waits for (``sends``), the waits on outcomes
(``outcomes``), a failed Dispatcher's hooks (``failure``), the system's options (``options``),
its stop order (``shutdown``), the start's own thread (``starting``) and the process a gateway
belongs to (``process``: a fork refuses it, interpreter exit stops it). Nothing here is public API.
"""
