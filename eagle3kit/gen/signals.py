"""SIGINT and SIGTERM during a gen run: the first stops new requests and gives those in
flight --grace seconds; the second ends the run at once. What is committed stays."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def handled(on_signal: Callable[[signal.Signals], None]) -> Iterator[None]:
    """`on_signal(sig)` runs in the event loop for each stop signal while inside."""
    loop = asyncio.get_running_loop()
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield
    finally:
        for sig, handler in before.items():
            loop.remove_signal_handler(sig)
            # asyncio leaves the default action; a caller's own handling is put back
            # (the CLI's: a SIGTERM while gen reports, or in a later quickstart stage).
            if handler is not None:
                signal.signal(sig, handler)
