"""Dispatchers: hold partition leases and move due occurrences onto the queue streams."""

from rsched.engine.dispatcher.dispatcher import Dispatcher
from rsched.engine.dispatcher.leases import LeaseKeeper

__all__ = ["Dispatcher", "LeaseKeeper"]
