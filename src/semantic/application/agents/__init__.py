"""The stateful agents use case: ``service`` (create, send, fork, retain, delete), ``turns``
(one turn rendered, generated and committed), ``values`` (what it takes and gives), who may
run a turn (``turn_gate``, ``leases``, ``keyed_locks``), what runs for an agent
(``live_turns``, ``plain_requests``), and the Responses API on top of it (``responses``)."""
