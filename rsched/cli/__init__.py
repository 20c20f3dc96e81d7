"""The `rsched` command line."""

from rsched.cli.main import main

__all__ = ["main"]
