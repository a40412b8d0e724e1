"""Sealed shard files: safetensors written by hand so they stream to disk with a checksum.

A shard is a valid safetensors file (any safetensors reader loads it). Its header metadata
holds the format version and `content_xxh3`, a checksum of every tensor's name, dtype, shape
and bytes; the manifest holds `xxh3`, a checksum of the whole file. Readers memory-map the
file and hand out zero-copy numpy views.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import xxhash
import zstandard

from eagle3kit._durable import open_new
from eagle3kit.format._io import disk_error
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.layout import TMP_SUFFIX

# safetensors dtype names; bf16 and fp8 travel as raw uint16 / uint8 views of the same bytes.
DTYPES: dict[str, np.dtype] = {
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "U8": np.dtype("u1"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "F8_E4M3": np.dtype("u1"),
}
_NAMES = {
    np.dtype("<i8"): "I64",
    np.dtype("<i4"): "I32",
    np.dtype("<i2"): "I16",
    np.dtype("u1"): "U8",
    np.dtype("<f4"): "F32",
    np.dtype("<f2"): "F16",
}
_HEADER_ALIGN = 8
_HASH_CHUNK = 1 << 24
_FRAME_CHUNK = 1 << 20

META_PER_SAMPLE = 64 << 10
META_PER_TOKEN = 64
META_SLACK = 4 << 10
"""A token shard's metadata frame decompresses to at most META_SLACK + META_PER_SAMPLE per
sample + META_PER_TOKEN per token (docs/format.md): the writer refuses a sample past its
share, and a reader stops decompressing at the bound, so a frame padded into a
decompression bomb costs no more memory than the shard's own arrays allow."""


def meta_bound(samples: int, tokens: int) -> int:
    """The most bytes a token shard's metadata frame may decompress to."""
    return META_SLACK + META_PER_SAMPLE * samples + META_PER_TOKEN * tokens


class FrameError(ValueError):
    """A zstd frame that does not decode, or decodes past its bound; says which."""


def unzstd(data: bytes, limit: int) -> bytes:
    """One zstd frame's content, never allocating more than `limit` bytes for it.

    zstandard's own `max_output_size` is ignored when the frame header states a content
    size (it allocates what the header says), so the stated size is checked first and a
    frame without one is read in bounded pieces."""
    try:
        stated = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        raise FrameError("not a zstd frame") from None
    if stated > limit:
        raise FrameError(f"decompresses past its bound of {limit:,} bytes")
    try:
        if stated >= 0:
            out = zstandard.ZstdDecompressor().decompress(data)
            if len(out) != stated:
                raise FrameError("holds other bytes than its header says")
            return out
        pieces, size = [], 0
        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            while piece := reader.read(min(_FRAME_CHUNK, limit + 1 - size)):
                pieces.append(piece)
                size += len(piece)
                if size > limit:
                    raise FrameError(f"decompresses past its bound of {limit:,} bytes")
        return b"".join(pieces)
    except zstandard.ZstdError:
        raise FrameError("does not decode") from None


@dataclass(frozen=True)
class WrittenShard:
    name: str
    bytes: int
    xxh3: str


def _dtype_name(array: np.ndarray, override: str | None) -> str:
    if override:
        return override
    try:
        return _NAMES[array.dtype.newbyteorder("<")]
    except KeyError:
        raise TypeError(f"no safetensors dtype for numpy {array.dtype}") from None


def _byte_view(array: np.ndarray) -> memoryview:
    # Flattened first: memoryview refuses to cast an empty multi-dimensional array, such as
    # the (0, 2) loss_spans of a commit whose samples have no loss tokens (all prompts only).
    flat = np.ascontiguousarray(array).reshape(-1)
    return memoryview(flat).cast("B")  # type: ignore[arg-type]  # numpy's stubs give ndarray the buffer protocol for Python >= 3.12 only


def content_checksum(tensors: dict[str, tuple[str, np.ndarray]]) -> str:
    h = xxhash.xxh3_128()
    for name in sorted(tensors):
        dtype, array = tensors[name]
        h.update(orjson.dumps([name, dtype, list(array.shape)]))
        h.update(_byte_view(array))
    return h.hexdigest()


def write_shard(
    path: Path,
    arrays: dict[str, np.ndarray],
    metadata: dict[str, str],
    dtypes: dict[str, str] | None = None,
) -> WrittenShard:
    """Write `arrays` to `path` durably: a temp file, fsync, then rename into place.

    `dtypes` overrides the safetensors dtype of some arrays (e.g. "BF16" for uint16 views).
    The directory fsync is left to the caller's commit, which does it once per commit.
    """
    dtypes = dtypes or {}
    tensors = {
        n: (_dtype_name(a, dtypes.get(n)), np.ascontiguousarray(a)) for n, a in arrays.items()
    }
    # Widest items first keeps every array naturally aligned once the header is padded to 8.
    order = sorted(tensors, key=lambda n: (-tensors[n][1].dtype.itemsize, n))
    header: dict[str, object] = {
        "__metadata__": {**metadata, "content_xxh3": content_checksum(tensors)}
    }
    offset = 0
    for name in order:
        dtype, array = tensors[name]
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    header_bytes = orjson.dumps(header)
    header_bytes += b" " * (-(8 + len(header_bytes)) % _HEADER_ALIGN)
    prefix = struct.pack("<Q", len(header_bytes)) + header_bytes

    tmp = path.with_name(path.name + TMP_SUFFIX)
    file_hash = xxhash.xxh3_128()
    try:
        with open_new(tmp) as f:
            chunks: list[bytes | memoryview] = [prefix, *(_byte_view(tensors[n][1]) for n in order)]
            for chunk in chunks:
                f.write(chunk)
                file_hash.update(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if not tmp.is_symlink():
            tmp.unlink(missing_ok=True)
        raise disk_error(path, exc) from None
    return WrittenShard(path.name, len(prefix) + offset, file_hash.hexdigest())


def file_checksum(path: Path) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a plain file"


class ShardFile:
    """A memory-mapped shard: its metadata and zero-copy views of its arrays."""

    def __init__(self, path: Path):
        self.path = path
        try:
            # Never blocks (a FIFO in a shard's place would wait for a writer forever) and
            # never follows a link out of shards/.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise DatasetError(f"{path}: shard missing (deleted or moved)") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise DatasetError(
                    f"{path}: a symbolic link, not a shard; shards are regular "
                    "files inside the dataset's shards/ folder"
                ) from None
            raise DatasetError(f"{path}: cannot read shard: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise DatasetError(
                    f"{path}: not a regular file ({_file_kind(info.st_mode)}); "
                    "a shard is a regular file"
                )
            size = info.st_size
            self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""
        except OSError as exc:
            raise DatasetError(f"{path}: cannot read shard: {exc.strerror}") from None
        finally:
            os.close(fd)
        self.size = size
        self.header = self._parse_header()
        self.metadata: dict[str, str] = self.header.pop("__metadata__", {})

    def _damaged(self, why: str) -> DatasetError:
        return DatasetError(f"{self.path}: shard damaged ({why})")

    def _parse_header(self) -> dict:
        if self.size < 8:
            raise self._damaged(f"file is {self.size} bytes, too short for a header")
        (n,) = struct.unpack_from("<Q", self._map, 0)
        if 8 + n > self.size:
            raise self._damaged("header runs past the end of the file: truncated")
        try:
            header = orjson.loads(bytes(self._map[8 : 8 + n]))
        except orjson.JSONDecodeError:
            raise self._damaged("header is not valid JSON") from None
        if not isinstance(header, dict):
            raise self._damaged("header is not a JSON object")
        # A damaged or hand-edited header can be valid JSON holding anything: the safetensors
        # spec says metadata maps str to str and offsets and dims are non-negative ints, and
        # anything else must end here, naming the file, not as a TypeError deep in a reader.
        metadata = header.get("__metadata__", {})
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise self._damaged("header metadata is not a map of strings")
        self._data_start = 8 + n
        end = 0
        for name, spec in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype = DTYPES[spec["dtype"]]
                start, stop = spec["data_offsets"]
                shape = spec["shape"]
                if not isinstance(shape, list) or not all(
                    type(v) is int and v >= 0 for v in (start, stop, *shape)
                ):
                    raise ValueError(name)
                count = int(np.prod(shape, dtype=np.int64))
            except (KeyError, TypeError, ValueError):
                raise self._damaged(f"bad entry for tensor {name!r}") from None
            if stop - start != count * dtype.itemsize or start < 0:
                raise self._damaged(f"tensor {name!r} size does not match its shape")
            end = max(end, stop)
        if self._data_start + end != self.size:
            raise self._damaged(
                f"{self.size} bytes on disk, header describes {self._data_start + end}: truncated"
                if self._data_start + end > self.size
                else "trailing bytes after the data"
            )
        return header

    def names(self) -> list[str]:
        return list(self.header)

    def dtype(self, name: str) -> str:
        return self.header[name]["dtype"]

    def array(self, name: str, dtype: str | None = None, ndim: int | None = None) -> np.ndarray:
        """A read-only zero-copy view of tensor `name` (bf16 as uint16, fp8 as uint8); with
        `dtype` or `ndim`, one that has them, else DatasetError naming the shard."""
        try:
            spec = self.header[name]
        except KeyError:
            raise self._damaged(f"tensor {name!r} missing") from None
        if (dtype is not None and spec["dtype"] != dtype) or (
            ndim is not None and len(spec["shape"]) != ndim
        ):
            raise self._damaged(
                f"tensor {name!r} is {spec['dtype']} {spec['shape']}, expected {ndim}-D {dtype}"
            )
        start, stop = spec["data_offsets"]
        stored = DTYPES[spec["dtype"]]
        flat = np.frombuffer(
            self._map,
            dtype=stored,
            count=(stop - start) // stored.itemsize,
            offset=self._data_start + start,
        )
        return flat.reshape(spec["shape"])

    def verify(self, expected_xxh3: str | None = None) -> None:
        """Raise DatasetError unless both checksums hold."""
        if expected_xxh3 is not None:
            actual = xxhash.xxh3_128(self._map).hexdigest()
            if actual != expected_xxh3:
                raise self._damaged("checksum differs from the manifest: contents changed on disk")
        tensors = {n: (self.dtype(n), self.array(n)) for n in self.header}
        if content_checksum(tensors) != self.metadata.get("content_xxh3"):
            raise self._damaged("checksum differs from the one written in the shard")
