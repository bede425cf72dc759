"""Request bodies read as the JSON they are."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from litestar.dto import MsgspecDTO

T = TypeVar("T", bound=msgspec.Struct)


class StrictBody(MsgspecDTO[T]):
    """A body decoded strictly into its ``msgspec.Struct``: ``"max_tokens": "5"``,
    ``"stream": "true"`` or ``"pinned": 1`` is refused as OpenAI and Anthropic refuse it,
    where Litestar's own reading (``msgspec.convert(strict=False)``, made for query
    strings) would take them and act on them. A route names it as
    ``dto=StrictBody[TheBody]``; the OpenAPI schema still describes ``TheBody``."""

    def decode_bytes(self, value: bytes) -> Any:
        return msgspec.json.decode(value, type=self.model_type, strict=True)
