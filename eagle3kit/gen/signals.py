"""SIGINT and SIGTERM during a gen run: the first stops new requests and gives those in
flight --grace seconds; the second ends the run at once. What is committed stays."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def handled(on_signal: Callable[[], None]) -> Iterator[None]:
    """`on_signal` runs in the event loop for each stop signal while inside."""
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
