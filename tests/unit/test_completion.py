from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from semantic.application.engine.completion import CompletionDetector
from semantic.domain.generation import CompletionCriteria, FinishReason
from tests.unit.fakes import ByteTokenizer

ALPHABET = st.sampled_from(list("ab c\n.é日😀"))
TEXT = st.text(alphabet=ALPHABET, min_size=0, max_size=40)


@st.composite
def generations(draw: st.DrawFn) -> tuple[str, list[bytes], list[str], int]:
    """A text, a random split of its UTF-8 bytes into tokens, stop strings, max_tokens."""
    text = draw(TEXT)
    data = text.encode()
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=len(data))))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True) if b > a]
    stops = draw(st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), max_size=3))
    max_tokens = draw(st.integers(1, len(pieces) + 2))
    return text, pieces, stops, max_tokens


def run(
    pieces: list[bytes], stops: list[str], max_tokens: int, markers: tuple[str, ...] = ()
) -> tuple[CompletionDetector, list[str]]:
    eos = len(pieces)
    tokenizer = ByteTokenizer([*pieces, b""])
    criteria = CompletionCriteria(
        max_tokens=max_tokens, stop_strings=tuple(stops), stops_before=markers
    )
    detector = CompletionDetector(tokenizer, criteria, frozenset({eos}))
    streamed: list[str] = []
    for token in [*range(len(pieces)), eos]:
        progress = detector.add(token)
        streamed.append(progress.text)
        if progress.finish is not None:
            break
    return detector, streamed


def expected_text(
    pieces: list[bytes], stops: list[str], max_tokens: int, markers: tuple[str, ...] = ()
) -> str:
    # A character the token limit cut off is not shown (only the end can be cut).
    shown = b"".join(pieces[:max_tokens]).decode("utf-8", errors="ignore")
    marked = [i for i in (shown.find(m) for m in markers) if i != -1]
    within = shown[: min(marked)] if marked else shown  # stops end before the first marker
    found = [i for i in (within.find(s) for s in stops) if i != -1]
    return shown[: min(found)] if found else shown


@settings(max_examples=400, deadline=None)
@given(generations())
def test_text_ends_at_the_first_stop_or_the_token_limit(
    case: tuple[str, list[bytes], list[str], int],
) -> None:
    _, pieces, stops, max_tokens = case
    detector, streamed = run(pieces, stops, max_tokens)
    expected = expected_text(pieces, stops, max_tokens)
    assert detector.text == expected
    assert not any(stop in detector.text for stop in stops)
    shown = ""
    for delta in streamed:
        shown += delta
        assert expected.startswith(shown), "a stream showed text past the cut"
    assert shown == expected


@settings(max_examples=400, deadline=None)
@given(generations(), st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), max_size=2))
def test_stops_end_only_the_text_before_the_first_marker(
    case: tuple[str, list[bytes], list[str], int], markers: list[str]
) -> None:
    _, pieces, stops, max_tokens = case
    detector, streamed = run(pieces, stops, max_tokens, tuple(markers))
    expected = expected_text(pieces, stops, max_tokens, tuple(markers))
    assert detector.text == "".join(streamed) == expected


def test_a_stop_string_inside_a_tool_call_does_not_cut_it() -> None:
    call = [b"Sure. <tool", b'_call>{"city": ', b'"Paris"}', b"</tool_call>"]
    detector, _ = run(call, ["Paris", "<tool"], 10, ("<tool_call>",))
    assert detector.reason is FinishReason.END_OF_TURN
    assert detector.text == b"".join(call).decode()
    detector, _ = run([b"Paris is near. <tool_call>"], ["Paris"], 10, ("<tool_call>",))
    assert (detector.reason, detector.text) == (FinishReason.STOP_STRING, "")


def test_a_stop_string_that_could_start_a_marker_waits_for_the_next_text() -> None:
    detector, streamed = run([b"a <to", b"ad", b" b"], ["<to"], 10, ("<tool_call>",))
    assert streamed[0] == "a "  # "<to" could be a call starting: neither shown nor ended
    assert (detector.reason, detector.text) == (FinishReason.STOP_STRING, "a ")


@settings(max_examples=300, deadline=None)
@given(generations())
def test_kept_tokens_end_where_the_text_ends(case: tuple[str, list[bytes], list[str], int]) -> None:
    _, pieces, stops, max_tokens = case
    detector, _ = run(pieces, stops, max_tokens)
    kept = [t for t in detector.kept_tokens if t < len(pieces)]
    kept_text = b"".join(pieces[t] for t in kept).decode("utf-8", errors="replace")
    assert detector.text.startswith(kept_text.rstrip("\ufffd"))
    assert kept == list(range(len(kept))), "kept tokens are a prefix of the generated ones"


def test_a_stop_string_split_across_tokens_is_caught_and_never_shown() -> None:
    detector, streamed = run([b"Hello", b" wor", b"ld", b"!!"], ["world"], 10)
    assert detector.text == "Hello "
    assert detector.reason is FinishReason.STOP_STRING
    assert streamed == ["Hello", " ", ""]


def test_text_that_cannot_start_a_stop_string_is_shown_at_once() -> None:
    _, streamed = run([b"abc", b"def", b"xy"], ["xyz"], 10)
    assert streamed[0] == "abc"
    assert streamed[1] == "def"
    assert streamed[2] == ""  # "xy" could still become "xyz"


def test_a_stop_string_that_starts_earlier_wins_even_if_it_completes_later() -> None:
    detector, _ = run([b"a", b"b", b"c", b"d"], ["abcd", "c"], 10)
    assert detector.text == ""


def test_an_end_token_as_the_last_token_allowed_ends_the_turn_not_at_the_limit() -> None:
    tokenizer = ByteTokenizer([b"a", b""])
    detector = CompletionDetector(tokenizer, CompletionCriteria(max_tokens=2), frozenset({1}))
    assert detector.add(0).finish is None
    assert detector.add(1).finish is FinishReason.END_OF_TURN


def test_a_stop_string_completed_by_the_last_token_allowed_is_a_stop() -> None:
    detector, _ = run([b"Hel", b"lo!", b" more"], ["lo!"], 2)
    assert detector.reason is FinishReason.STOP_STRING
    assert (detector.text, detector.stop_string) == ("Hel", "lo!")


def test_a_character_cut_by_the_token_limit_is_not_shown() -> None:
    smile = "😀".encode()
    detector, streamed = run([b"hi ", smile[:2], smile[2:]], [], 2)
    assert detector.reason is FinishReason.MAX_TOKENS
    assert detector.text == "".join(streamed) == "hi "


def test_the_end_token_is_kept_but_never_shown() -> None:
    tokenizer = ByteTokenizer([b"ok", b"<|im_end|>"])
    detector = CompletionDetector(tokenizer, CompletionCriteria(max_tokens=9), frozenset({1}))
    detector.add(0)
    assert detector.add(1).finish is FinishReason.END_OF_TURN
    assert detector.text == "ok"
    assert detector.kept_tokens == [0, 1]


def test_max_chars_cuts_the_text() -> None:
    tokenizer = ByteTokenizer([b"abcd"])
    criteria = CompletionCriteria(max_tokens=9, max_chars=6)
    detector = CompletionDetector(tokenizer, criteria, frozenset())
    assert detector.add(0).finish is None
    progress = detector.add(0)
    assert progress.finish is FinishReason.MAX_CHARS
    assert detector.text == "abcdab"
    assert detector.kept_tokens == [0]


def test_low_confidence_stops_after_its_patience_runs_out() -> None:
    tokenizer = ByteTokenizer([b"x"])
    criteria = CompletionCriteria(max_tokens=99, min_top_prob=0.2, low_confidence_patience=3)
    detector = CompletionDetector(tokenizer, criteria, frozenset())
    reasons = [detector.add(0, top_prob=p).finish for p in (0.1, 0.1, 0.9, 0.1, 0.1, 0.1)]
    assert reasons == [None, None, None, None, None, FinishReason.LOW_CONFIDENCE]


def test_low_confidence_is_off_by_default() -> None:
    tokenizer = ByteTokenizer([b"x"])
    detector = CompletionDetector(tokenizer, CompletionCriteria(max_tokens=99), frozenset())
    assert all(detector.add(0, top_prob=0.01).finish is None for _ in range(50))


def test_a_stop_string_in_text_held_behind_a_cut_character_is_a_stop() -> None:
    """The last token's text ends in half a character, so it was held back until the end."""
    detector, streamed = run([b"x", b"ab\xf0\x9f"], ["ab"], 2)
    assert (detector.reason, detector.stop_string) == (FinishReason.STOP_STRING, "ab")
    assert detector.text == "".join(streamed) == "x"
    assert detector.kept_tokens == [0]
