"""Callables a run's workers call at the start of every epoch, named by the driver: how a test
reaches inside a running worker (kill it, slow it) without the training loop knowing any test.

``NCE_TEST_HOOK=module:function[:ARG][,...]`` in the environment of the process that starts the
run (train.py's driver) names them; each is called as ``function(context, ARG)`` on every rank,
with ``context`` = {"epoch": 0-based epoch about to run, "rank", "world", "run_dir"}. The
workers import them by name, so they must live in the project (``training.faults``), not in
``tests/``."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from prepared.errors import UsageError

ENV = "NCE_TEST_HOOK"

Hook = Callable[[dict, "str | None"], None]


def hook_specs() -> list[str]:
    """The hooks this run's workers call: ``$NCE_TEST_HOOK``'s."""
    return [s.strip() for s in os.environ.get(ENV, "").split(",") if s.strip()]


def resolve(specs: list[str]) -> list[tuple[Hook, str | None]]:
    """Each ``module:function[:ARG]`` as (the function, ARG); a name that does not import is one
    line naming ``NCE_TEST_HOOK``."""
    hooks = []
    for spec in specs:
        module, _, rest = spec.partition(":")
        name, _, arg = rest.partition(":")
        try:
            hooks.append((getattr(importlib.import_module(module), name), arg or None))
        except (ImportError, AttributeError, ValueError) as e:
            raise UsageError(f"{ENV}: {spec!r} is not an importable module:function ({e}); "
                             "fix or unset it") from None
    return hooks


def call_all(hooks: list[tuple[Hook, str | None]], context: dict) -> None:
    for hook, arg in hooks:
        hook(context, arg)
