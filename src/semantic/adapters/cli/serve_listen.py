"""``semantic serve``'s checks before the model loads: the address resolves, the keys
file reads, the data directory is ours alone, the port is free, descriptors are raised.

Each fails fast with a message naming the flag, in a second rather than after the model's
load; the hold on the data directory and the listening sockets last as long as the process.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from semantic.domain.errors import SemanticError

if TYPE_CHECKING:
    from semantic.adapters.http.keys import KeyRing
    from semantic.config import Settings


class ListenError(SemanticError):
    """The server cannot listen where ``--host`` and ``--port`` say."""


Address = tuple[socket.AddressFamily, Any]


def keys_and_data_directory(settings: Settings) -> KeyRing:
    """The keys (a bad keys file is said before anything is created), then the data
    directory, private from here on, held by this process."""
    from semantic.adapters.cli.privacy import keep_private
    from semantic.adapters.http.keys import keyring
    from semantic.adapters.storage.data_dir_lock import acquire_data_directory

    keys = keyring(settings.api_key, settings.api_keys_file)
    keep_private(settings.data_dir)
    acquire_data_directory(settings.data_dir)
    return keys


def resolve(host: str, port: int) -> list[Address]:
    """Every address ``--host`` names, once each (a bad name is a ``ListenError``)."""
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as error:
        raise ListenError(f"cannot resolve --host {host!r}: {error.strerror}") from None
    return list(dict.fromkeys((family, address) for family, _, _, _, address in found))


def listen(addresses: list[Address], host: str, port: int) -> list[socket.socket]:
    """Bind and listen on every address, as asyncio's ``create_server`` would."""
    sockets: list[socket.socket] = []
    try:
        for family, address in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen()
    except OSError as error:
        for sock in sockets:
            sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sockets
