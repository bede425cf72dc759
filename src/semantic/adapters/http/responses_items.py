"""The Responses API's items to transcript messages and back: input items (``message``,
``function_call``, ``function_call_output``) as the agent's messages, and a reply as output
items (``message`` with ``output_text``, ``function_call``)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from typing import Any

from semantic.application.agents.values import CommittedReply
from semantic.domain.errors import InvalidRequestError
from semantic.domain.generation import LIMITS
from semantic.domain.tools import sent_back
from semantic.ports.metadata_store import MessageRecord

_TEXT_PARTS = {"input_text", "output_text", "text", "refusal"}
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def call_item_id(call_id: str) -> str:
    """The ``function_call`` item of a call: named after the call, so the stream can name
    it as the call begins and the stored response names it alike."""
    return f"fc_{call_id.removeprefix('call_')}"


def fresh_id(item: dict[str, Any]) -> str:
    """A new id for an item, in its kind's form (``msg_...``, ``fc_...``)."""
    return new_id(_PREFIXES.get(str(item.get("type")), "item"))


def _given_id(item: dict[str, Any]) -> str:
    given = item.get("id")
    return given if isinstance(given, str) and given else fresh_id(item)


def input_items(raw: str | list[Any], field: str = "input") -> list[dict[str, Any]]:
    """The input as items, each with an ``id``, in the shape listed back; refused naming
    the item and its index where its kind is not served."""
    if isinstance(raw, str) and raw:
        raw = [{"type": "message", "role": "user", "content": raw}]
    if not raw:
        raise InvalidRequestError(f"{field} must not be empty", param=field)
    return [_item(item, f"{field}[{index}]", field) for index, item in enumerate(raw)]


def _item(item: object, where: str, field: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise InvalidRequestError(f"{where} must be an object", param=field)
    kind = item.get("type", "message" if "role" in item else None)
    if not isinstance(kind, str | None):
        raise InvalidRequestError(f"{where}: type must be a string", param=field)
    if kind == "message":
        return _message(item, where, field)
    if kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise InvalidRequestError(f"{where}: a function_call needs {key!r}", param=field)
        arguments = sent_back(item["arguments"])  # a call cut short (incomplete) too
        return {"status": "completed", **item, "arguments": arguments, "id": _given_id(item)}
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise InvalidRequestError(
                f"{where}: a function_call_output needs 'call_id'", param=field
            )
        output = item.get("output")
        text = output if isinstance(output, str) else _joined(output, where, field)
        return {**item, "id": _given_id(item), "output": text}
    if kind == "reasoning" and not item.get("encrypted_content"):
        return {**item, "id": _given_id(item)}
    raise InvalidRequestError(
        f"{where}: items of type {kind!r} are not supported (message, function_call and "
        "function_call_output are)",
        param=field,
    )


def _message(item: dict[str, Any], where: str, field: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidRequestError(f"{where}: role {role!r} is not supported", param=field)
    content = item.get("content")
    part = "output_text" if role == "assistant" else "input_text"
    text = content if isinstance(content, str) else _joined(content, where, field)
    parts = [{"type": part, "text": text, **({"annotations": []} if role == "assistant" else {})}]
    return {
        "id": _given_id({**item, "type": "message"}),
        "type": "message",
        "role": role,
        "status": "completed",
        "content": parts,
    }


def _joined(content: object, where: str, field: str) -> str:
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}: content must be text or a list of parts", param=field)
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in _TEXT_PARTS:
            raise InvalidRequestError(
                f"{where}.content[{index}]: parts of type {kind!r} are not supported "
                "(only text is)",
                param=field,
            )
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise InvalidRequestError(f"{where}.content[{index}] needs its text", param=field)
        texts.append(text)
    return "".join(texts)


def unanswerable(
    items: Sequence[dict[str, Any]], before: Sequence[dict[str, Any]] = ()
) -> list[str]:
    """The call ids of the ``function_call_output`` items among ``items`` that answer no
    ``function_call`` before them (in ``before``, then in ``items``)."""
    called = {i["call_id"] for i in before if i["type"] == "function_call"}
    orphans = []
    for item in items:
        if item["type"] == "function_call":
            called.add(item["call_id"])
        elif item["type"] == "function_call_output" and item["call_id"] not in called:
            orphans.append(item["call_id"])
    return orphans


def stored_messages(items: list[dict[str, Any]]) -> tuple[MessageRecord, ...]:
    """A conversation's stored items as the transcript holds them, less a result whose
    call is gone (its item deleted since): what the next response reads must not fail on
    an item no request holds, and that the client may not find."""
    orphans = set(unanswerable(items))
    answered = [
        i for i in items if i["type"] != "function_call_output" or i["call_id"] not in orphans
    ]
    return item_messages(answered)


def item_messages(items: list[dict[str, Any]]) -> tuple[MessageRecord, ...]:
    """Items as the transcript holds them: calls join the assistant message before them."""
    records: list[MessageRecord] = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            role = _ROLES[item["role"]]
            records.append(MessageRecord(role, "".join(p["text"] for p in item["content"])))
        elif kind == "function_call":
            call = {"id": item["call_id"], "name": item["name"], "arguments": item["arguments"]}
            last = records[-1] if records else None
            if last is not None and last.role == "assistant" and last.raw is None:
                calls = [*json.loads(last.tool_calls or "[]"), call]
                records[-1] = dataclasses.replace(last, tool_calls=json.dumps(calls))
            else:
                records.append(MessageRecord("assistant", "", tool_calls=json.dumps([call])))
        elif kind == "function_call_output":
            records.append(MessageRecord("tool", item["output"], tool_call_id=item["call_id"]))
    return tuple(records)


def output_items(
    reply: CommittedReply, message_id: str, logprobs: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """``logprobs``: the message's tokens' entries (empty where not asked, or for a reply
    with calls, whose tokens are not all the message's text)."""
    items = []
    if reply.text or not reply.calls:
        cut = reply.finish_reason in LIMITS and not reply.calls  # its text ends at the limit
        shown = None if reply.calls else logprobs
        items.append(message_item(message_id, reply.text, shown, complete=not cut))
    items += [call_item(c.id, c.name, c.arguments, complete=c.complete) for c in reply.calls]
    return items


def message_item(
    message_id: str,
    text: str,
    logprobs: list[dict[str, Any]] | None = None,
    *,
    complete: bool = True,
) -> dict[str, Any]:
    """``complete`` False: its text was cut at the limit (``max_output_tokens``)."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "status": "completed" if complete else "incomplete",
        "content": [part],
    }


def call_item(call_id: str, name: str, arguments: str, *, complete: bool) -> dict[str, Any]:
    return {
        "id": call_item_id(call_id),
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed" if complete else "incomplete",
    }


MAX_PAGE = 100


def page(items: list[dict[str, Any]], limit: int, after: str | None, order: str) -> dict[str, Any]:
    """A list page as OpenAI gives one: ``after`` an item's id, in ``order``."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequestError(f"limit must be between 1 and {MAX_PAGE}", param="limit")
    if order not in ("asc", "desc"):
        raise InvalidRequestError("order must be 'asc' or 'desc'", param="order")
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [i["id"] for i in ordered]
        if after not in ids:
            raise InvalidRequestError(f"after names no item: {after!r}", param="after")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }
