"""Dispatchers: hold partition leases and move due occurrences onto the queue streams."""

from .dispatcher import Dispatcher
from .leases import LeaseKeeper

__all__ = ["Dispatcher", "LeaseKeeper"]
