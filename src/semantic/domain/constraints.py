"""What a reply must look like: a JSON document of a schema, or tool calls written in the
model's call format. The edge (HTTP routes and the model's tool-call format) builds one of
these; the engine turns it into a per-sequence token mask through a grammar engine, so the
reply parses and validates by construction.

Deliberately grammar-engine neutral: it says *what* must come out (literal text around JSON
of a schema), not how a mask is computed, so the engine behind it can be swapped.
"""

from __future__ import annotations

from dataclasses import dataclass

from semantic.domain.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class TaggedSchema:
    """One way a call may be written: ``begin``, then JSON matching ``schema``, then ``end``.

    For a tool named ``get_weather`` in the default format that is, say,
    ``begin='<tool_call>{"name": "get_weather", "arguments": '``, the arguments' JSON Schema,
    and ``end='}</tool_call>'``.
    """

    begin: str
    schema: str
    """JSON Schema, as JSON text."""
    end: str


@dataclass(frozen=True, slots=True)
class OutputConstraint:
    """``json_schema`` (the whole reply is one JSON value of it), ``calls``, or both.

    With ``calls``: the reply may hold free text until one of ``triggers`` appears, and from
    there one of ``calls`` must be completed (the trigger is the start of some ``begin``).
    ``require_call`` forbids free text before the first call (tool_choice ``required``, a
    named tool, Anthropic's ``any``/``tool``). ``max_calls`` bounds how many calls follow each
    other (1 when parallel tool calls are off); after the last call the reply ends.
    ``end_on_repeat``: a call written exactly as an earlier one of the reply ends the reply
    there (the repeat is the model looping, not a call to make again).

    With both (tools under ``auto`` and a response format, as the OpenAI Agents SDK sends
    an agent's tools and its output type): the reply is its calls, or instead of free text
    one JSON value of ``json_schema``, as OpenAI's structured outputs are beside tools.
    """

    json_schema: str | None = None
    calls: tuple[TaggedSchema, ...] = ()
    triggers: tuple[str, ...] = ()
    require_call: bool = False
    max_calls: int | None = None
    end_on_repeat: bool = False

    def __post_init__(self) -> None:
        if self.json_schema is None and not self.calls:
            raise InvalidRequestError("a constraint is a JSON schema, tool calls, or both")
        if self.json_schema is not None and self.require_call:
            raise InvalidRequestError("a reply that must call a tool has no answer for a schema")
        if self.calls and not self.require_call and not self.triggers:
            raise InvalidRequestError("optional tool calls need the text that starts one")
        if self.max_calls is not None and self.max_calls < 1:
            raise InvalidRequestError("max_calls must be at least 1")

    @property
    def cache_key(self) -> tuple[object, ...]:
        """Equal for constraints that compile to the same grammar."""
        return (
            self.json_schema,
            self.calls,
            self.triggers,
            self.require_call,
            self.max_calls,
            self.end_on_repeat,
        )


class UnsupportedSchemaError(InvalidRequestError):
    """A JSON Schema that constrained decoding cannot honour, found when the constraint is
    compiled (at submission, before any work). ``keywords`` names what the grammar engine
    refused (empty when the schema itself is malformed); ``call_index`` is the position in
    ``OutputConstraint.calls`` of the schema at fault (None: ``json_schema``), so the edge
    can re-raise it naming its own field (``tools[i].function.parameters``, say)."""

    def __init__(
        self,
        message: str,
        *,
        keywords: tuple[str, ...] = (),
        call_index: int | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.keywords = keywords
        self.call_index = call_index
