"""The ``semantic`` command line: ``model pull``, ``generate``, ``serve``, ``keys``.

The benchmarks run from a checkout: ``python -m benchmarks`` (``--help`` lists them)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from semantic.adapters.cli import flags
from semantic.adapters.cli.log_repeats import RepeatFilter
from semantic.config import DEFAULT_MODEL, WEIGHT_CHOICES
from semantic.domain.errors import SemanticError


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the subcommand, with its own usage line, not the top level's
        hint = (
            "; --data-dir is serve's (nothing else keeps data)" if "--data-dir" in unknown else ""
        )
        said = f"unrecognized arguments: {' '.join(unknown)}{hint}"
        getattr(args, "parser", parser).error(said)
    if check := getattr(args, "check", None):
        check(args)  # what no single option's type can see; a usage error (exit 2) if wrong
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RepeatFilter())  # a line repeated in a loop is counted, not written
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO if args.log_info else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[handler],
    )
    if not args.verbose:  # Alembic's own lines (its plugins, its context) say nothing to users
        logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        _prepare_process()
        return int(args.handler(args))
    except SemanticError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # the machine's, not the code's: a read-only or full disk, say
        logging.getLogger(__name__).debug("failed", exc_info=error)
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _prepare_process() -> None:
    """The one step that readies this process for MLX (BLAS, malloc, JIT), before any
    command imports it: importing semantic's modules changes nothing by itself."""
    from semantic.adapters.mlx.cpu import prepare_process

    prepare_process()
    try:
        import mlx.core  # noqa: F401 - only to say clearly when MLX has no backend here
    except ImportError as error:
        raise SemanticError(
            f"MLX cannot load its backend ({error}). On Linux install it with the package: "
            'pip install "semantic[cpu]" (or "semantic[cuda]" on an NVIDIA GPU machine)'
        ) from None


def _parser() -> argparse.ArgumentParser:
    from semantic.adapters.cli import commands, keys, serve

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--model",
        type=flags.non_empty,
        default=DEFAULT_MODEL,
        help="embedded model name, local mlx-lm model directory, or hub id (default: %(default)s)",
    )
    common.add_argument(
        "--model-cache",
        type=flags.path,
        default=None,
        help="per-user model cache (default: $SEMANTIC_MODEL_CACHE or ~/.cache/semantic/models)",
    )
    common.add_argument(
        "--weights",
        choices=WEIGHT_CHOICES,
        default=None,
        help="weight format of the embedded model or a GGUF file (auto: float32 on a Linux "
        "CPU, 4-bit on Apple silicon, a GGUF file's own; quantized or q4: the GGUF's own "
        "4-bit; q8: 8-bit; bf16: bfloat16)",
    )
    common.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default=None,
        help="MLX device for the model (auto: a GPU where MLX has one; default: "
        "$SEMANTIC_DEVICE or auto)",
    )
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    common.add_argument("--log-info", action="store_true", help="info logging")

    parser = argparse.ArgumentParser(
        prog="semantic",
        description="A local LLM server that keeps every agent's KV cache, on disk too.",
        epilog="Benchmarks run from a checkout: python -m benchmarks --help",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    commands.register(sub, common)
    serve.register(sub, common)
    keys.register(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("semantic")
    except PackageNotFoundError:  # run from a checkout that was never installed
        from semantic import __version__

        return __version__


if __name__ == "__main__":
    raise SystemExit(main())
