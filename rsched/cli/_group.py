"""The root command group: its options are accepted after a subcommand too.

`rsched jobs list --redis-url URL` reads as naturally as `rsched --redis-url URL jobs list`;
click only knows the second.  Before parsing, the group moves each of its own options found
after the subcommand (with its value) in front of it, unless the subcommand that runs has an
option of that name itself (`rsched dev --redis-url` is dev's own) or the option comes after
`--`.
"""

from __future__ import annotations

import click


def _option(cmd: click.Command, name: str) -> click.Option | None:
    for p in cmd.params:
        if isinstance(p, click.Option) and name in (*p.opts, *p.secondary_opts):
            return p
    return None


def _takes_value(opt: click.Option | None, token: str) -> bool:
    """Whether the token after ``token`` (an option as written) is its value."""
    return opt is not None and not opt.is_flag and not opt.count and "=" not in token


class GlobalOptionsGroup(click.Group):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, self._hoisted(ctx, args))

    def _hoisted(self, ctx: click.Context, args: list[str]) -> list[str]:
        # First pass: the chain of commands the arguments name, and where the first starts.
        cmd: click.Command = self
        path: list[click.Command] = []
        first_sub: int | None = None
        i = 0
        while i < len(args):
            token = args[i]
            if token == "--":
                break
            if token.startswith("-") and token != "-":
                opt = _option(cmd, token.split("=", 1)[0]) or (
                    _option(self, token.split("=", 1)[0]) if path else None)
                i += 2 if _takes_value(opt, token) else 1
                continue
            if isinstance(cmd, click.Group):
                sub = cmd.get_command(ctx, token)
                if sub is None:
                    break
                path.append(sub)
                cmd = sub
                if first_sub is None:
                    first_sub = i
            i += 1
        if first_sub is None:
            return args
        runs = path[-1]
        # Second pass: move the root's options found after the subcommand to before it.
        front: list[str] = []
        rest: list[str] = []
        i = first_sub
        while i < len(args):
            token = args[i]
            if token == "--":
                rest += args[i:]
                break
            name = token.split("=", 1)[0]
            own = _option(self, name) if token.startswith("--") else None
            if own is not None and _option(runs, name) is None:
                n = 2 if _takes_value(own, token) else 1
                front += args[i:i + n]
                i += n
                continue
            opt = _option(runs, name) if token.startswith("-") else None
            n = 2 if _takes_value(opt, token) else 1
            rest += args[i:i + n]
            i += n
        return [*args[:first_sub], *front, *rest]
