"""The HTTP API (Starlette): `rsched.api.app.create_app(settings)`, served by `rsched api`.

This package exports nothing itself: importing it loads no Starlette, so import what you need
from its modules (rsched.api.app, rsched.api.guard, ...).
"""
