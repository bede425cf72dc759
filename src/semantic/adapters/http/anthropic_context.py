"""Anthropic's ``context_management`` (beta ``context-management-2025-06-27``) read into
the domain's context edit, and the edits applied said back in its shape. Only
``clear_tool_uses_20250919`` is served; any other edit type is refused by name."""

from __future__ import annotations

from typing import Any

from semantic.application.chat.context_edits import AppliedEdit
from semantic.domain.cache_spec import BLOCK_TOKENS
from semantic.domain.context_edits import DEFAULT_KEEP, DEFAULT_TRIGGER_TOKENS, ClearToolUses
from semantic.domain.errors import InvalidRequestError

FIELD = "context_management"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
_EDIT_FIELDS = {"type", "trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"}


def context_edit(raw: dict[str, Any] | None) -> ClearToolUses | None:
    if raw is None:
        return None
    if set(raw) - {"edits"} or not isinstance(raw.get("edits", []), list):
        raise InvalidRequestError(f"{FIELD} takes one field, 'edits' (a list)", param=FIELD)
    edits = raw.get("edits", [])
    if len(edits) > 1:
        raise InvalidRequestError(f"{FIELD}.edits: at most one edit is served", param=FIELD)
    return _clear_tool_uses(edits[0], f"{FIELD}.edits[0]") if edits else None


def _clear_tool_uses(edit: object, where: str) -> ClearToolUses:
    if not isinstance(edit, dict) or edit.get("type") != CLEAR_TOOL_USES:
        kind = edit.get("type") if isinstance(edit, dict) else None
        raise InvalidRequestError(
            f"{where}: the edit type {kind!r} is not supported ({CLEAR_TOOL_USES} is)", param=FIELD
        )
    unknown = set(edit) - _EDIT_FIELDS
    if unknown:
        raise InvalidRequestError(f"{where}: no field {sorted(unknown)[0]!r}", param=FIELD)
    trigger = _amount(edit.get("trigger"), f"{where}.trigger", ("input_tokens", "tool_uses"))
    keep = _amount(edit.get("keep"), f"{where}.keep", ("tool_uses",))
    least = _amount(edit.get("clear_at_least"), f"{where}.clear_at_least", ("input_tokens",))
    tokens, uses = _trigger(trigger, f"{where}.trigger")
    return ClearToolUses(
        trigger_tokens=tokens,
        trigger_uses=uses,
        keep=DEFAULT_KEEP if keep is None else keep[1],
        clear_at_least=0 if least is None else least[1],
        exclude=frozenset(_names(edit.get("exclude_tools"), f"{where}.exclude_tools")),
        clear_inputs=_inputs(edit.get("clear_tool_inputs"), f"{where}.clear_tool_inputs"),
    )


def _trigger(given: tuple[str, int] | None, where: str) -> tuple[int | None, int | None]:
    """Input tokens or tool uses; below one KV block of tokens (or one use) it would clear
    results on every turn of a conversation just begun, so it is refused."""
    if given is None:
        return DEFAULT_TRIGGER_TOKENS, None
    kind, value = given
    least = BLOCK_TOKENS if kind == "input_tokens" else 1
    if value < least:
        raise InvalidRequestError(f"{where}.value must be at least {least} {kind}", param=FIELD)
    return (value, None) if kind == "input_tokens" else (None, value)


def _amount(raw: object, where: str, kinds: tuple[str, ...]) -> tuple[str, int] | None:
    """``{"type": <one of kinds>, "value": <int>}``, or None where not given."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("type") not in kinds or set(raw) != {"type", "value"}:
        shapes = " or ".join(f'{{"type": "{k}", "value": N}}' for k in kinds)
        raise InvalidRequestError(f"{where} must be {shapes}", param=FIELD)
    value = raw["value"]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequestError(f"{where}.value must be a whole number, 0 or more", param=FIELD)
    return str(raw["type"]), value


def _names(raw: object, where: str) -> list[str]:
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(n, str) for n in raw):
        raise InvalidRequestError(f"{where} must be a list of tool names", param=FIELD)
    return raw


def _inputs(raw: object, where: str) -> bool | frozenset[str]:
    if raw is None or isinstance(raw, bool):
        return bool(raw)
    return frozenset(_names(raw, where))


def applied_edits(edit: ClearToolUses | None, applied: AppliedEdit | None) -> dict[str, Any]:
    """The response's ``context_management`` (present when the request asked for edits)."""
    if edit is None:
        return {}
    edits = (
        []
        if applied is None
        else [
            {
                "type": CLEAR_TOOL_USES,
                "cleared_tool_uses": applied.cleared_uses,
                "cleared_input_tokens": applied.cleared_tokens,
            }
        ]
    )
    return {"context_management": {"applied_edits": edits}}
