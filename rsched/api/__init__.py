"""The HTTP API (Starlette): `rsched.api.app.create_app(settings)`, served by `rsched api`.

Imported lazily, so CLI commands that only read the JSON shapes (rsched.api.convert) do not
load Starlette.
"""

from typing import Any

__all__ = ["create_app", "protect"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rsched.api import app

        return getattr(app, name)
    raise AttributeError(name)
