"""The command line as it may be shown or stored: secrets masked."""

from __future__ import annotations

import shlex
import sys

SECRET_FLAGS = ("--api-key",)


def command_line(argv: list[str] | None = None) -> str:
    """`sys.argv` quoted for a shell, with the values of secret flags replaced."""
    args = list(sys.argv if argv is None else argv)
    if args and args[0].endswith(("/eagle3kit", "__main__.py")):
        args[0] = "eagle3kit"
    masked: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            masked.append("***")
            hide_next = False
        elif arg in SECRET_FLAGS:
            masked.append(arg)
            hide_next = True
        elif arg.startswith(tuple(f"{flag}=" for flag in SECRET_FLAGS)):
            masked.append(arg.split("=", 1)[0] + "=***")
        else:
            masked.append(arg)
    return shlex.join(masked)
