"""Domain errors to HTTP, once, at the edge: each protocol gets its own error shape.

OpenAI clients read ``{"error": {"message", "type", "param", "code"}}``; Anthropic clients
read ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import copy
import logging
import re
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotAuthorizedException,
    NotFoundException,
    ValidationException,
)

from semantic.adapters.http.common import ClientGoneError
from semantic.adapters.http.identity import AdminKeyNeededError, NamespaceNotAllowedError
from semantic.application.chat.generation import GenerationFailedError
from semantic.application.chat.message_threads import THREAD_PARAM
from semantic.domain.errors import (
    AgentBusyError,
    AgentExistsError,
    AgentKeepsTranscriptError,
    AgentNotFoundError,
    DiskFullError,
    InvalidRequestError,
    LeaseLostError,
    ModelUnavailableError,
    NoRoomCameError,
    ObjectNotFoundError,
    PoolExhaustedError,
    PromptTooLongError,
    QueueFullError,
    SemanticError,
    ShuttingDownError,
    StorageUnavailableError,
)

log = logging.getLogger(__name__)
E = TypeVar("E", bound=InvalidRequestError)


@dataclass(frozen=True, slots=True)
class Problem:
    status: int
    kind: str
    message: str
    param: str | None = None
    retry_after: float | None = None
    details: dict[str, Any] | None = None
    """Anthropic's ``error.details``: what a client recovers by (``error_code``)."""


class ModelNotFoundError(SemanticError):
    """The request names a model this server does not serve."""


class ThreadsNotServedError(InvalidRequestError):
    """Anthropic's ``thread`` where no thread is held (a token count): refused with the code
    its SDK recovers by, sending the conversation whole, unthreaded."""

    def __init__(self) -> None:
        super().__init__(
            "thread: a token count holds no thread; count the whole conversation",
            param="thread",
        )


_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


_HTTP_KINDS = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
    421: "misdirected_request",
}
"""Error codes for what the framework refuses before a route runs."""

_PLAIN: tuple[tuple[type[Exception], int, str], ...] = (
    (ClientGoneError, 499, "client_closed_request"),  # nginx's code: nobody reads it
    (NamespaceNotAllowedError, 403, "namespace_not_allowed"),
    (AdminKeyNeededError, 403, "admin_key_needed"),
    (AgentNotFoundError, 404, "not_found"),
    (ObjectNotFoundError, 404, "not_found"),
    (ModelNotFoundError, 404, "not_found"),
    (AgentExistsError, 409, "conflict"),
    (AgentKeepsTranscriptError, 409, "conflict"),
    (LeaseLostError, 409, "lease_lost"),  # nothing of the turn was kept: send it again
    (GenerationFailedError, 500, "generation_failed"),
    (SemanticError, 400, "invalid_request"),
)


def in_own_words(error: E, field: str, own: str, param: str) -> E:
    """The application's refusal as a front door words it: the field the chat turn calls
    ``field`` (``max_tokens``, ``response_format``) named ``own``, as that door's request
    names it; the same error type, its other attributes kept."""
    renamed = copy.copy(error)
    renamed.args = (str(error).replace(field, own),)
    renamed.param = param
    return renamed


def problem_for(error: Exception) -> Problem:
    """The status, error code and message a domain (or framework) error maps to."""
    match error:
        case ThreadsNotServedError():
            unsupported = {"error_code": "thread_unsupported_request", "unsupported": ["thread"]}
            return Problem(400, "invalid_request", str(error), error.param, details=unsupported)
        case InvalidRequestError():
            kind = (
                "context_length_exceeded"
                if isinstance(error, PromptTooLongError)
                else "invalid_request"
            )
            return Problem(400, kind, str(error), error.param)
        case ObjectNotFoundError() if error.param in ("previous_response_id", THREAD_PARAM):
            return _lost_chain(error)
        case QueueFullError() | AgentBusyError():
            return _retry_later(error)
        case PoolExhaustedError() | NoRoomCameError():
            return Problem(429, "out_of_memory", f"{error}; retry later", retry_after=2.0)
        case ModelUnavailableError() | ShuttingDownError() | StorageUnavailableError():
            return _unavailable(error)
        case NotAuthorizedException():
            return Problem(401, "invalid_api_key", "missing or invalid API key")
        case ValidationException() | msgspec.DecodeError() | RecursionError() | UnicodeError():
            if (unreadable := _unreadable(error)) is not None:
                return unreadable
        case HTTPException():
            kind = _HTTP_KINDS.get(error.status_code, "http_error")
            return Problem(error.status_code, kind, str(error.detail))
    for error_type, status, code in _PLAIN:
        if isinstance(error, error_type):
            return Problem(status, code, str(error), getattr(error, "param", None))
    log.exception("unexpected error", exc_info=error)
    return Problem(500, "internal_error", "internal server error")


def _unreadable(error: Exception) -> Problem | None:
    """A body that is not JSON, or not the route's shape (None: some other error)."""
    match error:
        case ValidationException():
            return _invalid(_items(error), error.detail)
        case msgspec.ValidationError():  # a body of the wrong shape (``StrictBody``)
            return _invalid([_msgspec_item(str(error))], str(error))
        case msgspec.DecodeError():
            return Problem(400, "invalid_request", _not_json_message(str(error)))
        case RecursionError() if "deserializ" in str(error):  # msgspec, on deep nesting
            return Problem(400, "invalid_request", "the request body is nested too deeply")
        case UnicodeError():
            return Problem(400, "invalid_request", f"the request body is not valid UTF-8: {error}")
    return None


def _lost_chain(error: ObjectNotFoundError) -> Problem:
    """What a client continuing a chain it was told of gets for one not held, with the code
    its SDK recovers by (sending the whole history instead): OpenAI's 400
    ``previous_response_not_found``, or Anthropic's 404 with ``error.details.error_code``
    ``thread_not_found`` (a thread never held, let go, or another namespace's)."""
    if error.param == THREAD_PARAM:
        lost = {"error_code": "thread_not_found"}
        return Problem(404, "not_found", str(error), error.param, details=lost)
    said = str(error).replace("response ", "Previous response with id ", 1)
    return Problem(400, "previous_response_not_found", said, error.param)


def _retry_later(error: QueueFullError | AgentBusyError) -> Problem:
    """A full queue here (429), or the agent's turn running on another instance (409,
    ADR 0025): the same request may succeed after ``Retry-After``."""
    if isinstance(error, AgentBusyError):
        return Problem(409, "agent_busy", str(error), retry_after=error.retry_after_s)
    return Problem(429, "queue_full", str(error), retry_after=error.retry_after_s)


def _unavailable(error: Exception) -> Problem:
    """503 for a moment's outage; 507 for a full disk, which the operator must clear."""
    if isinstance(error, DiskFullError):
        return Problem(507, "insufficient_storage", str(error), retry_after=10.0)
    return Problem(503, "unavailable", str(error), retry_after=5.0)


def _not_json_message(detail: str) -> str:
    message = f"the request body is not valid JSON: {detail}"
    if "truncated" in detail:  # msgspec says so of an unpaired surrogate escape too
        message += " (cut short, or an unpaired surrogate escape such as \\ud800)"
    return message


ENDPOINTS = (
    "OpenAI's /v1/chat/completions, /v1/completions, /v1/responses, /v1/conversations and"
    " /v1/models, Anthropic's /v1/messages, and /v1/agents"
)
"""What a client that asked for a path nobody serves is told this server has."""


def handle(request: Request[Any, Any, Any], error: Exception) -> Response[Any]:
    problem = _routing_problem(request, error) or _too_large(request, error) or problem_for(error)
    metrics = request.app.state.get("metrics")
    if metrics is not None:  # the server's ``Metrics``; absent in apps built for one test
        metrics.on_refused(problem.status, problem.kind)
    headers = headers_for(problem)
    if isinstance(error, HTTPException) and error.headers:  # a 405's Allow, say
        headers = {**error.headers, **headers}
    return Response(
        body_for(request.url.path, problem), status_code=problem.status, headers=headers
    )


def _routing_problem(request: Request[Any, Any, Any], error: Exception) -> Problem | None:
    """A path or method the router has no handler for, said with what there is (the
    framework's own words are only "Not Found" and "Method Not Allowed")."""
    where = f"{request.method} {request.url.path}"
    if isinstance(error, NotFoundException) and error.detail == "Not Found":
        return Problem(404, "not_found", f"no endpoint at {where}; this server has {ENDPOINTS}")
    if isinstance(error, MethodNotAllowedException):
        headers = error.headers or {}
        allowed = next((v for k, v in headers.items() if k.lower() == "allow"), "")
        message = f"{request.method} is not allowed on {request.url.path}"
        return Problem(
            405, "method_not_allowed", f"{message}; allowed: {allowed}" if allowed else message
        )
    return None


def _too_large(request: Request[Any, Any, Any], error: Exception) -> Problem | None:
    """A body over the limit, said with the limit (the framework's words are only "Request
    Entity Too Large"): a client splitting its upload needs the figure."""
    if not (isinstance(error, HTTPException) and error.status_code == 413):
        return None
    limit = request.route_handler.resolve_request_max_body_size()
    said = f" of {limit / (1 << 20):g} MiB" if limit else ""
    return Problem(413, "request_too_large", f"the request body is over this server's limit{said}")


def body_for(path: str, problem: Problem) -> dict[str, Any]:
    """The error body in the shape the client of ``path`` expects."""
    if path.startswith("/v1/messages"):
        kind = _ANTHROPIC_TYPES.get(problem.status, _default_type(problem, "api_error"))
        error: dict[str, Any] = {"type": kind, "message": _anthropic_words(problem)}
        if problem.details:
            error["details"] = problem.details
        return {"type": "error", "error": error}
    return {
        "error": {
            "message": problem.message,
            "type": _OPENAI_TYPES.get(problem.status, _default_type(problem, "server_error")),
            "param": problem.param,
            "code": problem.kind,
        }
    }


def _anthropic_words(problem: Problem) -> str:
    """Anthropic's body has no code: a context overflow says so as Anthropic's does
    ("prompt is too long: ..."), the words its clients look for (pydantic-ai, LangChain)."""
    said = problem.message
    if problem.kind == "context_length_exceeded" and not said.startswith("prompt is too long"):
        return f"prompt is too long: {said}"
    return said


def _default_type(problem: Problem, server_side: str) -> str:
    """A status without its own type (405, say): the client's error or the server's."""
    return "invalid_request_error" if problem.status < 500 else server_side


def headers_for(problem: Problem) -> dict[str, str]:
    headers = {}
    if problem.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(problem.retry_after)))
    if problem.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return headers


def _invalid(items: list[dict[str, Any]], detail: str) -> Problem:
    """Each problem with where it is (``Expected `float | null`, got `str` at
    `temperature```): a client with several fields of one type needs the field."""
    found = [item for item in items if item.get("message")]
    messages = [
        f"{item['message']} at `{item['key']}`" if item.get("key") else str(item["message"])
        for item in found
    ]
    in_query = found and all(item.get("source") == "query" for item in found)
    prefix = "invalid query parameter: " if in_query else "invalid request body: "
    message = prefix + "; ".join(messages) if messages else f"invalid request body: {detail}"
    return Problem(400, "invalid_request", message, _first_key(found))


def _first_key(items: list[dict[str, Any]]) -> str | None:
    """Where the first problem is; for a field unknown or missing at the root, that field."""
    for item in items:
        if item.get("key"):
            return str(item["key"])
        named = _NAMED_FIELD.search(str(item.get("message", "")))
        if named:
            return named.group(1)
    return None


def _msgspec_item(text: str) -> dict[str, Any]:
    """msgspec's ``Expected `int`, got `str` - at `$.max_tokens``` as a problem at
    ``max_tokens``, the path a client reads in ``param``."""
    message, _, where = text.partition(" - at `$")
    key = where.rstrip("`").lstrip(".")
    return {"message": message, "key": key} if key else {"message": message}


_NAMED_FIELD = re.compile(r"(?:unknown|missing required) field `([^`]+)`")


def _items(error: ValidationException) -> list[dict[str, Any]]:
    """Litestar's problems, with the body's root (its key ``data``) named by no key."""
    extra = error.extra if isinstance(error.extra, list) else []
    items = [dict(item) for item in extra if isinstance(item, dict)]
    for item in items:
        if item.get("key") == "data":
            del item["key"]
        if item.get("message") == "'data'":  # Litestar's KeyError for a request without a body
            item["message"] = "the body is empty; send a JSON object"
    return items
