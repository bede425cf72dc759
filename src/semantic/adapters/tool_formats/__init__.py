"""Tool-call formats: each module says how tools reach the prompt, how a call is written,
and the ``OutputConstraint`` a call needs. ``format_for`` picks one by the chat template."""

from __future__ import annotations

from semantic.adapters.tool_formats.default import DefaultFormat
from semantic.adapters.tool_formats.json_calls import JsonCallFormat
from semantic.adapters.tool_formats.template import TemplateFormat, hermes, llama3, mistral

PromptFormat = DefaultFormat | TemplateFormat


def format_for(chat_template: str | None) -> PromptFormat:
    """The format of the template's own tool calls where it takes ``tools`` and writes calls
    in a family known here; the default format otherwise (ADR 0018)."""
    template = chat_template or ""
    if "tools" not in template:
        return DefaultFormat()
    if "<tool_call>" in template:
        return hermes()
    if "[TOOL_CALLS]" in template:
        return mistral()
    if "<|python_tag|>" in template or '"parameters"' in template:
        return llama3()
    return DefaultFormat()


__all__ = ["DefaultFormat", "JsonCallFormat", "PromptFormat", "TemplateFormat", "format_for"]
