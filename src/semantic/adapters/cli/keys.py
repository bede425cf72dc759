"""``semantic keys``: make API keys bound to a namespace, and the keys file's lines.

The server keeps only each key's SHA-256 (``semantic.adapters.http.keys``); the key itself
is shown once, here, to be handed to its tenant.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from semantic.adapters.cli import flags

NAMESPACE_HELP = "the namespace the key opens (letters, digits, '.', '_', '-'); '*': every one"


def register(sub: Any) -> None:
    keys = sub.add_parser("keys", help="API keys bound to namespaces (serve --api-keys-file)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    add = keys_sub.add_parser(
        "add", help="make a key, append its hash to the keys file and print the key once"
    )
    add.add_argument("namespace", type=flags.non_empty, help=NAMESPACE_HELP)
    add.add_argument(
        "--file",
        type=flags.path,
        default=None,
        help="the keys file, created if missing (default: $SEMANTIC_API_KEYS_FILE)",
    )
    add.set_defaults(handler=add_key, parser=add, verbose=False, log_info=False)
    hashed = keys_sub.add_parser(
        "hash", help="print the keys file's line for a key read from stdin"
    )
    hashed.add_argument("namespace", type=flags.non_empty, help=NAMESPACE_HELP)
    hashed.set_defaults(handler=hash_key, parser=hashed, verbose=False, log_info=False)


def add_key(args: argparse.Namespace) -> int:
    from semantic.adapters.http.keys import KEYS_FILE_ENV, hash_line, new_key

    named = os.environ.get(KEYS_FILE_ENV)
    path: Path | None = args.file or (Path(named).expanduser() if named else None)
    if path is None:
        parser: argparse.ArgumentParser = args.parser
        parser.error(f"give --file PATH or set ${KEYS_FILE_ENV}")
    key = new_key()
    line = hash_line(args.namespace, key)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as file:
        file.write(line + "\n")
    print(key)
    print(f"added to {path}: {line}", file=sys.stderr)
    return 0


def hash_key(args: argparse.Namespace) -> int:
    from semantic.adapters.http.keys import hash_line

    key = sys.stdin.readline().rstrip("\r\n")
    if not key:
        args.parser.error("give the key on stdin (`echo -n KEY | semantic keys hash NS`)")
    print(hash_line(args.namespace, key))
    return 0
