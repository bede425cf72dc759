"""The settings every command shares, from its common flags (``--model``,
``--model-cache``, ``--weights``, ``--device``) and what a command adds."""

from __future__ import annotations

import argparse
import os

from semantic.config import Settings


def settings_from(args: argparse.Namespace, **overrides: object) -> Settings:
    values: dict[str, object] = {"model": args.model}
    if getattr(args, "data_dir", None):  # only ``serve`` keeps anything there
        values["data_dir"] = args.data_dir
    if getattr(args, "model_cache", None):
        values["model_cache_dir"] = args.model_cache
    if getattr(args, "weights", None):
        values["weights"] = args.weights
    if device := getattr(args, "device", None) or os.environ.get("SEMANTIC_DEVICE"):
        values["device"] = device
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]  # argparse values are untyped by nature
