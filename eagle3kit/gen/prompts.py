"""Prompt sources for gen: files and HF datasets, read into `Conversation`s.

Files are `.jsonl` (one record per line, blank lines ignored), `.json` (a list of records, an
object holding one list, or one record) and `.parquet` (pyarrow, from the `hf` extra). Each
file's shape is detected from its first valid record, and every later record of that file must
have the same shape; `fmt` forces one shape for all files. The shapes:

- `messages`: OpenAI chat, `{"messages": [{"role", "content"}, ...], "tools": [...]}`.
  Assistant messages keep `tool_calls` and their reasoning (`reasoning_content`, or
  `reasoning` as some servers name it, stored as `reasoning_content`); tool messages keep
  `tool_call_id` and `name`. Content may also be a list of text parts, joined into one string.
- `sharegpt`: `{"conversations": [{"from", "value"}, ...]}`. human/user become user;
  gpt/assistant/chatgpt/bing/bard/model become assistant; system stays system;
  tool/observation/function_response become tool (a tool result, no tool_call_id: ShareGPT
  has none); function_call becomes an assistant message whose content is the call's text, so
  the call is a turn the target regenerates in its own tool-call syntax. A `tools` column may be
  a list or a JSON string (hermes, LLaMA-Factory).
- `conversations`: the same key holding role/content messages (SpecForge's layout).
- `prompt`: `{"prompt": str}` (or `question`, or alpaca's `instruction` plus `input`) becomes
  one user message.
- `mtbench`: EAGLE/FastChat `question.jsonl`, `{"question_id", "category", "turns": [str]}`.

Representation. gen's rule: an assistant message marks a turn to regenerate, and so does the
end of the list when the last message is not an assistant's. A K-turn MT-bench question is
therefore [user q1, assistant (content None), user q2, ..., user qK]: each placeholder marks one
of the first K-1 turns and the end marks turn K; nothing of the dataset's reference answers is
kept. A record-level `system` string (any shape) is prepended as a system message unless the
conversation already starts with one. Messages keep only the keys templates read (role,
content, reasoning_content, tool_calls, tool_call_id, name); `extra` keeps the scalar id-like
fields (EXTRA_FIELDS).

A record is malformed when it is not a JSON object, has no recognizable shape, has values of
the wrong type, is empty, or has its roles out of order: the first message after any system
messages must be the user's, a tool result must follow an assistant message or another tool
result, and two assistant messages never follow each other. Malformed records raise
`UserError("FILE:LINE: what is wrong")`, or are skipped and counted with skip_bad_lines.

This module reads the files (and HF datasets); prompt_records.py turns each record into a
conversation.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import xxhash

from eagle3kit.chat.conversation import Conversation
from eagle3kit.errors import UserError
from eagle3kit.format import normalize
from eagle3kit.gen.prompt_records import BadRecord, Intake, convert_records, detect_format

FORMATS = ("auto", "messages", "sharegpt", "conversations", "prompt", "mtbench")
SUFFIXES = (".jsonl", ".json", ".parquet")
HF_EXTRA = "pip install 'eagle3kit[hf]'"


@dataclass
class LoadStats:
    files: int
    records: int
    """Records read into conversations, duplicates included."""
    bad_lines: int
    """Malformed records skipped (only with skip_bad_lines)."""
    duplicates: int
    """Records dropped because an earlier one had the same prompt."""
    per_partition: dict[str, int] = field(default_factory=dict)
    """Conversations kept per partition, in order of first appearance."""


# Public API --------------------------------------------------------------------------------
def load_conversations(
    paths: list[Path],
    *,
    fmt: str = "auto",
    partition_field: str | None = None,
    skip_bad_lines: bool = False,
) -> tuple[list[Conversation], LoadStats]:
    """Every record of every file, in file order, deduplicated (the first occurrence stays)."""
    _check_format(fmt)
    paths = [Path(p) for p in paths]
    for path in paths:
        _check_path(path)
    intake = Intake(partition_field, skip_bad_lines)
    for path, default_partition in zip(paths, _file_partitions(paths), strict=True):
        convert_records(
            _read_records(path),
            intake,
            fmt=fmt,
            label=str(path),
            source=path.name,
            default_partition=default_partition,
        )
    intake.finish()
    convs, duplicates = dedupe(intake.convs)
    stats = LoadStats(
        files=len(paths),
        records=len(intake.convs),
        bad_lines=intake.bad_lines,
        duplicates=duplicates,
        per_partition=dict(Counter(c.partition for c in convs)),
    )
    return convs, stats


def load_hf_dataset(
    name_or_path: str,
    *,
    split: str = "train",
    fmt: str = "auto",
    partition_field: str | None = None,
) -> list[Conversation]:
    """A Hub dataset, a `save_to_disk` directory or a local data file, read through `datasets`.

    Not deduplicated (pass the result through `dedupe`); a malformed row raises, naming the
    dataset and the 1-based row.
    """
    _check_format(fmt)
    rows = _hf_rows(name_or_path, split)
    name = name_or_path.rstrip("/")
    local = Path(name).exists()
    intake = Intake(partition_field, skip_bad_lines=False)
    convert_records(
        enumerate(rows, 1),
        intake,
        fmt=fmt,
        label=name,
        source=Path(name).name if local else name,
        default_partition=Path(name).stem if local else name.rsplit("/", 1)[-1],
    )
    intake.finish()
    return intake.convs


def select(
    convs: list[Conversation],
    *,
    partition: str | None = None,
    max_samples: int | None = None,
    shuffle_seed: int | None = None,
) -> list[Conversation]:
    """One partition (or all), optionally shuffled, then cut to max_samples in total."""
    if partition in (None, "all"):
        chosen = list(convs)
    else:
        chosen = [c for c in convs if c.partition == partition]
        if not chosen:
            known = ", ".join(dict.fromkeys(c.partition for c in convs)) or "none"
            raise UserError(f"--partition {partition}: no such partition (known: {known}, or all)")
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(chosen)
    if max_samples is not None:
        if max_samples < 0:
            raise UserError(f"--max-samples must be >= 0 (got {max_samples})")
        chosen = chosen[:max_samples]
    return chosen


def dedupe(convs: list[Conversation]) -> tuple[list[Conversation], int]:
    """Conversations with distinct prompts, the first occurrence kept; and how many went."""
    seen: set[bytes] = set()
    kept = []
    for conv in convs:
        key = conversation_key(conv)
        if key not in seen:
            seen.add(key)
            kept.append(conv)
    return kept, len(convs) - len(kept)


def conversation_key(conv: Conversation) -> bytes:
    """A 16-byte digest of the normalized messages and tools: equal for identical prompts.

    Normalized as sample ids are (NFC, stripped strings, None values dropped), so two records
    that differ only in invisible ways count as one; source, line and partition are left out.
    """
    body = orjson.dumps(
        [normalize(conv.messages), normalize(conv.tools or [])], option=orjson.OPT_SORT_KEYS
    )
    return xxhash.xxh3_128_digest(body)


# Reading files -----------------------------------------------------------------------------
def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: unknown prompt format (one of {', '.join(FORMATS)})")


def _check_path(path: Path) -> None:
    if path.is_dir():
        raise UserError(f"{path}: a directory; pass the files in it (e.g. {path}/*.jsonl)")
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    if path.suffix.lower() not in SUFFIXES:
        raise UserError(f"{path}: unknown prompt file type (expected {', '.join(SUFFIXES)})")


def _file_partitions(paths: list[Path]) -> list[str]:
    """Each file's default partition: its stem, or its folder's name when stems collide.

    EAGLE ships every benchmark as `<set>/question.jsonl`; the set is the useful name.
    """
    stems = Counter(p.stem for p in dict.fromkeys(p.resolve() for p in paths))
    return [p.resolve().parent.name if stems[p.stem] > 1 else p.stem for p in paths]


def _read_records(path: Path) -> Iterator[tuple[int, object]]:
    """(1-based line or record number, parsed record or BadRecord) for every record."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _jsonl_records(path)
    if suffix == ".json":
        return _json_records(path)
    return _parquet_records(path)


def _jsonl_records(path: Path) -> Iterator[tuple[int, object]]:
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if number == 1:
                line = line.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 BOM is not JSON
            if not line.strip():
                continue
            try:
                yield number, orjson.loads(line.rstrip(b"\r\n"))  # columns of this line only
            except orjson.JSONDecodeError as exc:
                # orjson's own "line 1 column N" would read as a file line; give the column
                yield number, BadRecord(f"invalid JSON ({exc.msg} at column {exc.colno})")


def _json_records(path: Path) -> Iterator[tuple[int, object]]:
    data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if _looks_like_jsonl(data):  # many `.json` downloads are JSON Lines
            return _jsonl_records(path)
        raise UserError(f"{path}: invalid JSON ({exc})") from None
    return enumerate(_records_in(doc, path), 1)


def _looks_like_jsonl(data: bytes) -> bool:
    first, _, rest = data.strip().partition(b"\n")
    try:
        return bool(rest.strip()) and isinstance(orjson.loads(first), dict)
    except orjson.JSONDecodeError:
        return False


def _records_in(doc: object, path: Path) -> list[object]:
    """The records of a JSON document: the list itself, the one list an object holds, or the
    object itself when it is a record."""
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        if detect_format(doc) is not None:
            return [doc]
        lists = [key for key, value in doc.items() if isinstance(value, list)]
        if len(lists) == 1:
            return doc[lists[0]]
        what = f"several lists ({', '.join(lists)})" if lists else "no list"
        raise UserError(
            f"{path}: expected a list of records, but the top-level object holds {what}"
        )
    raise UserError(f"{path}: expected a list of records, got {type(doc).__name__}")


def _parquet_records(path: Path) -> Iterator[tuple[int, object]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading parquet needs pyarrow: {HF_EXTRA}") from None
    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own hierarchy and OSError alike
        raise UserError(f"{path}: not a readable parquet file ({exc})") from None
    return _parquet_rows(parquet)


def _parquet_rows(parquet: Any) -> Iterator[tuple[int, object]]:
    number = 0
    for batch in parquet.iter_batches(batch_size=4096):  # bounded memory on large files
        for row in batch.to_pylist():
            number += 1
            yield number, row


def _hf_rows(name_or_path: str, split: str) -> Iterable[object]:
    try:
        import datasets
    except ImportError:
        raise UserError(
            f"--dataset {name_or_path}: needs the datasets package: {HF_EXTRA}"
        ) from None
    path = Path(name_or_path)
    builders = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
    try:
        if path.is_dir() and any((path / f).exists() for f in ("state.json", "dataset_dict.json")):
            data = datasets.load_from_disk(str(path))  # what save_to_disk wrote
            return data[split] if isinstance(data, datasets.DatasetDict) else data
        if path.is_file():
            builder = builders.get(path.suffix.lower(), "json")
            return datasets.load_dataset(builder, data_files=str(path), split=split)
        return datasets.load_dataset(name_or_path, split=split)
    except Exception as exc:  # hub, network and builder errors share no base class
        raise UserError(
            f"--dataset {name_or_path} (split {split}): cannot load it "
            f"({type(exc).__name__}: {exc})"
        ) from None
