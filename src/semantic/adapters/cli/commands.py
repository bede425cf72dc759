"""Subcommands: each parses its options and calls into the composition root."""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from semantic.adapters.cli import flags
from semantic.adapters.cli.progress import ProgressPrinter
from semantic.adapters.cli.settings import settings_from

if TYPE_CHECKING:
    from semantic.bootstrap import EngineRuntime


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    model = sub.add_parser("model", help="manage models in the model cache")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    pull = model_sub.add_parser("pull", parents=[common], help="fetch and convert a model")
    pull.add_argument("--force", action="store_true", help="fetch and convert again")
    pull.set_defaults(handler=pull_model, parser=pull)

    generate = sub.add_parser("generate", parents=[common], help="stream one chat answer")
    generate.add_argument("prompt", help="the user message")
    generate.add_argument("--system", default=None, help="a system prompt")
    generate.add_argument(
        "--max-tokens",
        type=flags.positive_int,
        default=256,
        help="most tokens to generate (default: %(default)s)",
    )
    generate.add_argument(
        "--temperature",
        type=flags.temperature,
        default=0.0,
        help="0 to 2; 0 = greedy (default: %(default)s)",
    )
    generate.add_argument(
        "--top-p",
        type=flags.non_negative_float,
        default=1.0,
        help="nucleus sampling: above 0, at most 1 (default: %(default)s)",
    )
    generate.add_argument(
        "--seed", type=flags.non_negative_int, default=None, help="repeatable sampling, 0 or more"
    )
    generate.add_argument(
        "--stop",
        type=flags.non_empty,
        action="append",
        default=[],
        help="a stop string (repeatable)",
    )
    generate.set_defaults(
        handler=generate_text, parser=generate, check=lambda args: _check_sampling(generate, args)
    )


def _check_sampling(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The sampling ranges are the domain's (the HTTP API has the same); refused as usage."""
    from semantic.domain.errors import InvalidRequestError
    from semantic.domain.generation import SamplingParams

    try:
        args.sampling = SamplingParams(
            temperature=args.temperature, top_p=args.top_p, seed=args.seed
        )
    except InvalidRequestError as error:
        parser.error(f"argument --{(error.param or '').replace('_', '-')}: {error}")


def pull_model(args: argparse.Namespace) -> int:
    from semantic.adapters.mlx.errors import UnknownModelError
    from semantic.adapters.mlx.models.model_cache import (
        EMBEDDED_MODELS,
        ModelCache,
        default_weight_format,
    )
    from semantic.bootstrap import weight_format

    settings = settings_from(args)
    if settings.model not in EMBEDDED_MODELS:
        raise UnknownModelError(
            f"`model pull` fetches the embedded models ({', '.join(sorted(EMBEDDED_MODELS))}), "
            f"not {settings.model!r}: a local mlx-lm model directory needs no pull, and a "
            "Hugging Face hub id is fetched by `serve` or `generate --model` when first loaded"
        )
    cache = ModelCache(settings.model_cache_dir)
    chosen = weight_format(settings) or default_weight_format()
    path = cache.ensure(settings.model, chosen, ProgressPrinter(), force=args.force)
    print(path)
    return 0


def generate_text(args: argparse.Namespace) -> int:
    from semantic.bootstrap import build_engine

    settings = settings_from(args)
    runtime = build_engine(settings, ProgressPrinter(), warm_up=False)
    try:
        return _print_reply(runtime, args)
    except KeyboardInterrupt:
        runtime.close()
        _exit_at_once(130)
    except BrokenPipeError:  # the reader (`| head`) has what it wanted: nothing to say
        runtime.close()
        _exit_at_once(141)
    finally:
        runtime.close()


def _print_reply(runtime: EngineRuntime, args: argparse.Namespace) -> int:
    from semantic.application.engine.events import CompletionEvent, EngineEvent, TokenEvent
    from semantic.domain.chat import ChatMessage

    messages = [ChatMessage("system", args.system)] if args.system else []
    messages.append(ChatMessage("user", args.prompt))
    prompt = runtime.tokenizer.render_chat(messages)
    events: queue.Queue[EngineEvent] = queue.Queue()
    request = runtime.engine.request(
        "cli", prompt, max_tokens=args.max_tokens, sampling=args.sampling, stop=args.stop
    )
    runtime.loop.submit(events.put, request)
    while True:
        event = events.get()
        if isinstance(event, TokenEvent) and event.text:
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, CompletionEvent):
            sys.stdout.write("\n")
            if event.error:
                print(f"error: {event.error}", file=sys.stderr)
                return 1
            return 0


def _exit_at_once(code: int) -> NoReturn:
    """Exit without the interpreter's teardown. After an interrupted generation, MLX's
    C++ teardown sometimes met a thread still joinable and aborted the process
    (``terminate called without an active exception``, exit 134, QA pass 11: 2 of 7
    Ctrl-Cs); ``generate`` keeps no data, so there is nothing to finish."""
    with contextlib.suppress(OSError):  # a closed pipe
        sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
