"""The `--app module:attr` specs of `rsched worker` and `rsched dev`: import and check them."""

from __future__ import annotations

import importlib
from collections.abc import Iterable

import click

from rsched.core.handlers import App


def load_app(spec: str) -> App:
    """Import ``module:attr`` and check it is an rsched.App."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise click.BadParameter("expected module:attribute, e.g. myproject.jobs:app",
                                 param_hint="--app")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise click.BadParameter(f"cannot import {mod_name!r}: {e}", param_hint="--app") from None
    app = getattr(mod, attr, None)
    if not isinstance(app, App):
        raise click.BadParameter(f"{spec} is not an rsched.App", param_hint="--app")
    return app


def load_apps(specs: Iterable[str]) -> App:
    """One App with the handlers of every spec (a spec given twice counts once); a job type two
    of them register is refused, naming both, as one App refuses a second handler."""
    loaded = [(spec, load_app(spec)) for spec in dict.fromkeys(specs)]
    if not loaded:
        raise click.BadParameter("name at least one module:attribute", param_hint="--app")
    if len(loaded) == 1:
        return loaded[0][1]
    merged = App("+".join(app.name for _, app in loaded))
    owner: dict[str, str] = {}
    for spec, app in loaded:
        for job_type, registered in app.handlers.items():
            if job_type in owner:
                raise click.BadParameter(f"job type {job_type!r} has a handler in both "
                                         f"{owner[job_type]} and {spec}", param_hint="--app")
            owner[job_type] = spec
            merged.handlers[job_type] = registered
    return merged
