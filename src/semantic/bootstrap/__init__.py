"""The composition root: the one place that picks adapters and wires them to the rings.

The CLI, the HTTP server and the tests that need the real thing all build through here; unit
tests wire the application ring to fakes instead. ``model``: the model and the engine on it;
``services``: storage, the cache and what the front doors serve with.
"""

from semantic.bootstrap.model import (
    EngineRuntime,
    build_engine,
    freeze_startup_objects,
    grammar_compiler,
    pacer_config,
    prepare_model,
    weight_format,
)
from semantic.bootstrap.services import Services, start_services, stop_services

__all__ = [
    "EngineRuntime",
    "Services",
    "build_engine",
    "freeze_startup_objects",
    "grammar_compiler",
    "pacer_config",
    "prepare_model",
    "start_services",
    "stop_services",
    "weight_format",
]
