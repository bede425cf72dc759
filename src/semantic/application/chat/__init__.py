"""A chat turn's parts every front door shares: the generation use case (``generation``),
checks before a request queues (``request_validation``), replies that call tools
(``tool_replies``, ``call_memory``), and the prompt's text (``transcript``, ``context_edits``,
``prompt_marks``)."""
