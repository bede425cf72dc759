"""The grammar's guard against a model repeating a call: it ends the reply at a call
written exactly as an earlier one, also where one token spans a call's end and the
separator after it (no moment where the grammar could end between them)."""

from __future__ import annotations

from semantic.adapters.grammar.llguidance_grammar import RepeatGuard

CALL_A = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
CALL_B = '<tool_call>{"name": "f", "arguments": {"x": 2}}</tool_call>'


class Pieces:
    """Token ``i`` is the ``i``-th piece of text."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = [p.encode() for p in pieces]

    def decode_bytes(self, tokens: list[int], /) -> bytes:
        return b"".join(self.pieces[t] for t in tokens)


def fed(pieces: list[tuple[str, bool]]) -> RepeatGuard:
    """Each piece with whether the grammar may end after it."""
    guard = RepeatGuard(Pieces([p for p, _ in pieces]), ("<tool_call>",))
    for token, (_, accepting) in enumerate(pieces):
        guard.step(token, accepting)
    return guard


def test_a_call_written_again_ends_the_reply() -> None:
    head, tail = CALL_A[:-13], CALL_A[-13:]
    assert fed([("Sure. ", True), (head, False), (tail, True), ("\n", False)]).repeated is False
    again = [(head, False), (tail, True), ("\n", False), (head, False), (tail, True)]
    assert fed(again).repeated is True
    other = [(head, False), (tail, True), ("\n", False), (CALL_B, True)]
    assert fed(other).repeated is False


def test_a_token_spanning_a_calls_end_and_the_separator_does_not_hide_a_repeat() -> None:
    head, tail = CALL_A[:-13], CALL_A[-13:]
    spanning = [(head, False), (tail + "\n", False), (head, False), (tail, True)]
    assert fed(spanning).repeated is True


def test_a_reply_of_the_formats_json_is_no_call_and_no_error() -> None:
    """Tools beside a response format: a reply that is the format's JSON becomes accepting
    with no call trigger in it (it raised ``zip() argument 2 is longer``: a 500)."""
    guard = fed([('{"answer": ', False), ('"Paris"}', True), ("\n", False), (" ", True)])
    assert guard.repeated is False
