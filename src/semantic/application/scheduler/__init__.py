"""Who runs when: the queue of waiting requests (``request_queue``), how much prompt a round
takes and for whom (``prefill_adder``, ``pacer``), and the order a round's work runs in on
any backend (``round_runner``)."""
