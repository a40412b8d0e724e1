"""Files a server names: the one check before eagle3kit reads or deletes a file whose path
came in an HTTP answer (vLLM's extract_hidden_states connector names the hidden-states file
it wrote, SERVER_APIS.md §7; `extract --engine vllm` and `train --online --server` read it,
then delete it so the server's storage does not fill up).

The answer is not trusted: the user names the storage folder (`--hidden-states-dir`), and a
named path is taken only when it is a `.safetensors` name inside that folder once every
symlink of its parent is resolved, and the thing there is a regular file, not a symlink (a
FIFO or a directory is refused from its lstat, never opened: no hang). Only the file that
passed the check (the same inode) and its `.lock` (when a regular file) are ever deleted.
A name handed out twice is refused at once: a server answering two requests with one file
would otherwise have one reader wait for a file the other already deleted.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from eagle3kit.errors import UserError

FLAG = "--hidden-states-dir"
SUFFIX = ".safetensors"
"""What vLLM's connector names its files: `<shared_storage_path>/<request id>.safetensors`."""
REMEMBERED = 65536
"""Names remembered to refuse a repeat: far more than requests in flight, a few MiB."""
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class RefusedFile(UserError):
    """The server named something eagle3kit will not read or delete."""


def served_dir_problems(given: Path | str | None, needed: bool, needs: str) -> list[str]:
    """The config's check of the flag: required with `needs` (there is no safe default: a
    folder the server reports would let it name any `.safetensors` file, model weights
    included), refused without it, and an existing directory."""
    if given is None:
        return (
            [
                f"{needs} needs {FLAG} DIR: the server's shared_storage_path as this machine "
                "sees it (only files it names inside that folder are read, then deleted)"
            ]
            if needed
            else []
        )
    if not needed:
        return [f"{FLAG} applies to {needs} only"]
    if not Path(given).is_dir():
        return [f"{FLAG} {given}: no such directory"]
    return []


class StorageDir:
    """The folder the server writes its files to, as this machine sees it (the flag's value,
    symlinks resolved once), and the names it has handed out so far."""

    def __init__(self, given: Path | str) -> None:
        self.given = Path(given)
        self.root = os.path.realpath(given)
        if not os.path.isdir(self.root):
            raise UserError(
                f"{FLAG} {given}: no such directory (the server's "
                "shared_storage_path, as this machine sees it)"
            )
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def holds(self, reported: str) -> bool:
        """Whether a folder a server reports is this one or inside it (by name as given, or
        once resolved on this machine)."""
        given = os.path.normpath(os.path.abspath(self.given))
        named = os.path.normpath(os.path.abspath(reported))
        real = os.path.realpath(reported)
        return (
            os.path.commonpath([named, given]) == given
            or os.path.commonpath([real, self.root]) == self.root
        )

    def claim(self, named: object, who: str) -> str:
        """The checked path of the file `named` in an answer, refused (RefusedFile naming
        `who`) unless it is a new `.safetensors` name inside the folder whose last part is
        not a symlink. The file itself may not exist yet: the server may still write it."""
        if not isinstance(named, str) or not named or "\x00" in named:
            raise RefusedFile(
                f"{who}: the answer's hidden_states_path is {_shown(named)}, not a file path"
            )
        name = os.path.basename(named)
        if not name.endswith(SUFFIX) or name == SUFFIX:
            raise RefusedFile(f"{who}: the answer names {named!r}, not a {SUFFIX} file")
        parent = os.path.realpath(os.path.dirname(os.path.abspath(named)))
        if os.path.commonpath([parent, self.root]) != self.root:
            raise RefusedFile(
                f"{who}: the answer names {named!r}, outside {FLAG} "
                f"{self.given}; refused (nothing there is read or deleted)"
            )
        path = os.path.join(parent, name)
        with self._lock:
            if path in self._seen:
                raise RefusedFile(
                    f"{who}: the answer names {named!r}, a file it already named "
                    "for another request; refused"
                )
            self._seen[path] = None
            if len(self._seen) > REMEMBERED:
                self._seen.popitem(last=False)
        _kind(path, who)  # a symlink, FIFO or directory already there: refused now
        return path

    def wait(self, path: str, deadline: float, who: str, wait_s: float) -> None:
        """Until the server has finished writing `path`: its `.lock` is gone or can be
        locked (then it is deleted), or, without one, the file exists."""
        lock = f"{path}.lock"
        while True:
            if _kind(lock, who):
                if _locked_then_removed(lock, who):
                    return
            elif _kind(path, who):
                return
            if time.monotonic() > deadline:
                raise RefusedFile(
                    f"{who}: named {path} but it did not appear within "
                    f"{wait_s:.0f} s; is {FLAG} {self.given} the server's "
                    "storage path, shared with this machine under that name?"
                )
            time.sleep(0.01)

    @contextmanager
    def reading(self, path: str, who: str, max_bytes: int) -> Iterator[str]:
        """A name to read the checked file by (its open descriptor, so a swap after the
        check changes nothing); afterwards the file and its `.lock` are deleted, whatever
        happened, but only if the same regular file is still there."""
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise RefusedFile(f"{who}: {path} became a symlink; refused") from None
            raise RefusedFile(f"{who}: cannot open {path} ({exc.strerror})") from None
        st = os.fstat(fd)
        try:
            if not stat.S_ISREG(st.st_mode):
                raise RefusedFile(
                    f"{who}: {path} is {_what(st.st_mode)}, not a regular file; refused"
                )
            if st.st_size > max_bytes:
                raise RefusedFile(
                    f"{who}: {path} holds {st.st_size} bytes, more than the "
                    f"{max_bytes} its states can take; refused"
                )
            proc = f"/proc/self/fd/{fd}"
            yield proc if os.path.exists(proc) else path
        finally:
            os.close(fd)
            _remove_if(path, st)
            _remove_if(f"{path}.lock")


def _kind(path: str, who: str) -> bool:
    """Whether a regular file is at `path` (False: nothing); anything else is refused."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        raise RefusedFile(f"{who}: {path} is {_what(mode)}, not a regular file; refused")
    return True


def _locked_then_removed(lock: str, who: str) -> bool:
    """Take the writer's lock without waiting; once taken, the lock file is deleted."""
    try:
        fd = os.open(lock, _OPEN_FLAGS)
    except FileNotFoundError:
        return False  # released and removed between the lstat and the open
    except OSError as exc:
        raise RefusedFile(f"{who}: cannot open {lock} ({exc.strerror}); refused") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RefusedFile(f"{who}: {lock} is not a regular file; refused")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    _remove_if(lock)
    return True


def _remove_if(path: str, checked: os.stat_result | None = None) -> None:
    """Delete `path` if it is a regular file (and the very file `checked`, when given)."""
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(now.st_mode) or (
        checked is not None and (now.st_dev, now.st_ino) != (checked.st_dev, checked.st_ino)
    ):
        return
    with suppress(FileNotFoundError):
        os.unlink(path)


def _what(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
