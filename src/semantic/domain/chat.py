"""Chat messages as the domain sees them: a role and its text."""

from __future__ import annotations

from dataclasses import dataclass

from semantic.domain.errors import InvalidRequestError

ROLES = frozenset({"system", "user", "assistant"})


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidRequestError(
                f"message role must be one of {sorted(ROLES)}, got {self.role!r}",
                param="messages",
            )
