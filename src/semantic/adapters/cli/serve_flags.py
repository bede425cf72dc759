"""``semantic serve``'s flags, as data: one ``Flag`` per option, added by one loop.

A table rather than a page of ``add_argument`` calls, so a flag's name, type, default and
help read in one place and adding one is one entry. The order here is ``--help``'s order.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from semantic.adapters.cli import flags
from semantic.adapters.cli.descriptors import RESERVED
from semantic.config import default_data_dir

PREFAULT_MB = 1024
ALLOWED_HOSTS_ENV = "SEMANTIC_ALLOWED_HOSTS"
DATABASE_URL_ENV = "SEMANTIC_DATABASE_URL"
SHARED_BLOCKS_ENV = "SEMANTIC_SHARED_BLOCKS"
DEFAULT_MAX_CONNECTIONS = 4096


@dataclass(frozen=True)
class Flag:
    """One option's ``add_argument`` arguments; those left None are not passed (argparse's
    own defaults hold). ``default_from``: a default computed when the parser is built (it
    reads the environment), not when this module is imported."""

    name: str
    help: str
    type: Callable[[str], object] | None = None
    default: object = None
    default_from: Callable[[], object] | None = None
    metavar: str | None = None
    action: str | None = None
    choices: tuple[str, ...] | None = None

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        default = self.default_from() if self.default_from is not None else self.default
        given: dict[str, Any] = {  # argparse's keywords are typed one by one
            "type": self.type,
            "default": default,
            "metavar": self.metavar,
            "action": self.action,
            "choices": self.choices,
        }
        parser.add_argument(
            self.name, help=self.help, **{k: v for k, v in given.items() if v is not None}
        )


SERVE_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--quiet",
        action="store_true",
        help="print nothing at start (the block naming the address, model, device, BLAS "
        "and fast paths)",
    ),
    Flag(
        "--data-dir",
        type=flags.path,
        default_from=default_data_dir,
        help="where KV blocks and the database live (default: %(default)s)",
    ),
    Flag(
        "--database-url",
        type=flags.database_url,
        default=None,
        metavar="URL",
        help="keep agents, transcripts and block metadata in this database instead of "
        "SQLite in the data directory: postgresql+asyncpg://USER:PASSWORD@HOST/DB, shared by "
        f"the instances of a cluster (default: ${DATABASE_URL_ENV}, else SQLite)",
    ),
    Flag("--host", default="127.0.0.1", help="bind address (default: %(default)s)"),
    Flag("--port", type=flags.port, default=8000, help="port (default: %(default)s)"),
    Flag(
        "--api-key",
        type=flags.non_empty,
        default=None,
        help="require this key (Authorization: Bearer, or x-api-key) on every "
        "route but /health, an admin key: any namespace; default: $SEMANTIC_API_KEY (which "
        "keeps it out of the process list), else none",
    ),
    Flag(
        "--api-keys-file",
        type=flags.path,
        default=None,
        metavar="PATH",
        help="API keys, hashed, each bound to a namespace (`semantic keys add NAMESPACE "
        "--file PATH` makes one); a key works in its namespace only (default: "
        "$SEMANTIC_API_KEYS_FILE, else none)",
    ),
    Flag(
        "--allowed-host",
        type=flags.non_empty,
        action="append",
        default=[],
        metavar="NAME",
        help="a host name clients reach the server by, besides loopback names, IP addresses "
        "and --host; other Host headers get 421 (DNS rebinding); repeatable; '*': any "
        "(default: $SEMANTIC_ALLOWED_HOSTS, comma-separated, else none)",
    ),
    Flag(
        "--cors-origin",
        type=flags.non_empty,
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages from ORIGIN (such as http://localhost:3000, or *) call the "
        "server from a browser; repeatable (default: none)",
    ),
    Flag(
        "--kv-budget-mb",
        type=flags.positive_int,
        default=2048,
        help="memory for KV blocks, MiB; a restored prefix that cannot sit beside its copy "
        "may add up to one prefix until copied (default: %(default)s)",
    ),
    Flag(
        "--prefault-mb",
        type=flags.non_negative_int,
        default=None,
        help="memory touched up front (once the server answers, in its idle time) so the"
        " first restores after a restart do not page-fault, MiB; at most the KV budget; 0"
        f" turns it off (default: {PREFAULT_MB}, or the KV budget if smaller)",
    ),
    Flag(
        "--kv-at-rest",
        choices=("lossless", "q8", "q4"),
        default="lossless",
        help="how block files hold KV: exact, or 8-/4-bit, 3.6x/6.4x smaller and slightly"
        " different after a restore from disk (default: %(default)s)",
    ),
    Flag(
        "--eviction",
        choices=("agent", "lru"),
        default="agent",
        help="which cached KV leaves memory, and which agents' KV leaves the disk, first when "
        "it is short: 'agent' follows each agent's retention hints (TTL, pin, priority) and "
        "tool waits, then whoever is expected back latest; 'lru' ignores them "
        "(default: %(default)s)",
    ),
    Flag(
        "--namespace-quotas",
        type=flags.quotas_file,
        default=None,
        metavar="PATH",
        help='hard limits per namespace, JSON: {"team-a": {"memory_mb": 512, "disk_mb": 4096, '
        '"shared_mb": 8192}}; a namespace over one gives up its own KV, never another\'s '
        "(default: none)",
    ),
    Flag(
        "--disk-quota-mb",
        type=flags.positive_int,
        default=None,
        help="disk for KV blocks, MiB: least recently used agents' blocks go first, then the "
        "end of the conversation saved last; up to 4 spare block files (~12 MB each here) "
        "are kept beside it to be written over (default: no quota)",
    ),
    Flag(
        "--shared-blocks",
        type=flags.redis_url,
        default=None,
        metavar="URL",
        help="a Redis URL (redis://host:port/db) whose blocks instances share: new blocks are "
        "pushed there after each save, and restores read what this disk lacks from it; "
        "Redis down, the server serves from its own tiers (default: $SEMANTIC_SHARED_BLOCKS, "
        "else none)",
    ),
    Flag(
        "--disk-reserve-mb",
        type=flags.non_negative_int,
        default=1024,
        help="free disk to keep, MiB: when less is left, least recently used agents' blocks "
        "go first, so transcripts can still be saved (below 8 MiB free, no block file is "
        "written at all); 0: none (default: %(default)s)",
    ),
    Flag(
        "--max-tokens-cap",
        type=flags.positive_int,
        default=4096,
        help="largest max_tokens a request may ask for (default: %(default)s)",
    ),
    Flag(
        "--max-context",
        type=flags.context_tokens,
        default=None,
        metavar="TOKENS",
        help="tokens of context served, prompt and reply, at least 256; more than the "
        "model's window serves its window (default: the model's own window)",
    ),
    Flag(
        "--prefill-budget",
        type=flags.positive_int,
        default=None,
        help="a fixed number of prompt tokens prefilled per engine step (default: 1,024 "
        "while nothing decodes, 64 per waiting prompt while streams decode; docs/adr/0009)",
    ),
    Flag(
        "--prefill-ride",
        type=flags.non_negative_float,
        default=None,
        metavar="STEPS",
        help="a lone waiting prompt's chunk that fits the running streams' decode step (any "
        "chunk, with --prefill-slice 0) rides it, adding at most STEPS decode steps' time; "
        "fewer STEPS: smoother streams, a slower first token for the prompt; 0: passes of "
        "its own (default: 3; docs/adr/0009 shows the curve)",
    ),
    Flag(
        "--prefill-slice",
        type=flags.non_negative_float,
        default=None,
        metavar="STEPS",
        help="a lone waiting prompt too long to ride is computed a few layers at a time "
        "between and beside the streams' decode steps, each round held to 1 + STEPS of their "
        "steps as they were before it came; 0: it rides in smaller chunks instead (default: "
        "1.8; docs/adr/0009 shows the curve)",
    ),
    Flag(
        "--prefill-idle-slice",
        type=flags.non_negative_float,
        default=None,
        metavar="SECONDS",
        help="with nothing decoding, a lone long prompt is computed a few layers at a time, "
        "SECONDS a round, so a request arriving meanwhile starts within about that long; "
        "0: whole 1,024-token rounds, a few percent faster alone (default: 0.25)",
    ),
    Flag(
        "--max-waiting",
        type=flags.positive_int,
        default=256,
        help="queued requests before new ones get 429 (default: %(default)s)",
    ),
    Flag(
        "--max-connections",
        type=flags.positive_int,
        default=None,
        help="connections held at once; past it, the one slowest to send its request is "
        "closed for the new one, or, when all hold requests being answered, the new one gets "
        f"503 (default: what the descriptor limit allows, {RESERVED} kept for the server's "
        f"own files, up to {DEFAULT_MAX_CONNECTIONS})",
    ),
    Flag(
        "--header-timeout",
        type=flags.positive_float,
        default=10.0,
        metavar="SECONDS",
        help="a request's headers must arrive within this long, or its connection is closed "
        "with 408 (default: %(default)s)",
    ),
    Flag(
        "--body-timeout",
        type=flags.positive_float,
        default=30.0,
        metavar="SECONDS",
        help="a request's body must arrive within this long of its headers, or its connection "
        "is closed with 408 (default: %(default)s)",
    ),
    Flag(
        "--grace",
        type=flags.non_negative_float,
        default=30.0,
        help="seconds running requests get to finish on SIGTERM (default: %(default)s)",
    ),
)
"""The server's own options: where it keeps data, who may call it, memory and disk, the
prefill pacing (docs/adr/0009), the request queue and connection limits, the grace."""

LEASE_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--leases",
        action="store_true",
        help="take each agent's lease in the database for its turns, so instances sharing "
        "the database run an agent on one of them at a time",
    ),
    Flag(
        "--lease-seconds",
        type=flags.positive_float,
        default=30.0,
        metavar="SECONDS",
        help="how long an agent's lease lasts unless renewed: how long an agent of a dead "
        "instance waits for another (default: %(default)s)",
    ),
    Flag(
        "--lease-wait",
        type=flags.non_negative_float,
        default=5.0,
        metavar="SECONDS",
        help="how long a request waits for an agent busy on another instance before its 409 "
        "(default: %(default)s)",
    ),
)
"""One instance per agent at a time, for instances sharing a database (ADR 0025)."""


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Every ``serve`` option, in ``--help``'s order."""
    for flag in (*SERVE_FLAGS, *LEASE_FLAGS):
        flag.add_to(parser)
