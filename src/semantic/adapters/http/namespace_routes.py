"""A namespace's use of each tier beside its quota (ADR 0028): an admin key reads any, a
tenant's key its own."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get
from litestar.datastructures import State

from semantic.adapters.http.common import services
from semantic.adapters.http.identity import (
    NamespaceNotAllowedError,
    bound_namespace,
    checked_id,
)


class NamespaceController(Controller):
    path = "/v1/namespaces"
    tags = ("Namespaces",)

    @get("/{namespace:str}/usage")
    async def usage(
        self, request: Request[Any, Any, Any], namespace: str, state: State
    ) -> dict[str, Any]:
        """Bytes of memory, of block files and of the shared tier its KV takes now, and its
        quotas (None: no limit; the shared tier's use None where there is no tier or it does
        not answer). Disk bytes are the block files' sizes as recorded, so they agree with
        the files on disk."""
        namespace = checked_id(namespace, "namespace")
        bound = bound_namespace(request)
        if bound is not None and bound != namespace:
            raise NamespaceNotAllowedError(bound, namespace)
        use = await services(state).cache.namespace_usage(namespace)
        return {
            "object": "namespace.usage",
            "namespace": namespace,
            "memory": {"used_bytes": use.memory_bytes, "quota_bytes": use.quota.memory_bytes},
            "disk": {"used_bytes": use.disk_bytes, "quota_bytes": use.quota.disk_bytes},
            "shared": {"used_bytes": use.shared_bytes, "quota_bytes": use.quota.shared_bytes},
        }
