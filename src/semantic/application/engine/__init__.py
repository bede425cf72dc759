"""The engine, by job: ``intake`` (requests in, cancels), ``admission`` (prefix, memory,
sequence opened), ``rounds`` (one round's plan run on the backend), ``lifecycle`` (tokens
in, requests ended, KV handed on); ``batch_engine`` wires them into one round a ``step``.
Around it: ``engine_loop`` (its one thread, and events routed to their readers),
``active_request`` (a request's record), ``completion`` and ``detokenizer`` (when a stream
ends, and its safe text), ``events`` and ``generation_handle`` (what a reader sees), and
``prefix_sharing`` (a running request's prefix copied, not recomputed).

Import each from its module: the package imports nothing, so any module here may be
imported first (``books`` imports ``active_request``)."""
