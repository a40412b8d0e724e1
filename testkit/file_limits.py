"""A child process whose writes stop at a file size (RLIMIT_FSIZE): a full disk without
filling one, for the disk-full and hostile-server tests and the gen soak. Not a test module."""

from __future__ import annotations

import resource
import signal
from collections.abc import Callable


def limit_file_size(limit: int) -> Callable[[], None]:
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        # Without this the kernel kills the process with SIGXFSZ instead of failing the write.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    return preexec
