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
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
import xxhash

from eagle3kit.chat.conversation import Conversation
from eagle3kit.errors import UserError
from eagle3kit.format import normalize

FORMATS = ("auto", "messages", "sharegpt", "conversations", "prompt", "mtbench")
SUFFIXES = (".jsonl", ".json", ".parquet")
HF_EXTRA = "pip install 'eagle3kit[hf]'"

PROMPT_KEYS = ("prompt", "question", "instruction")
SHAPE_KEYS = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "conversations": ("conversations",),
    "prompt": PROMPT_KEYS,
    "mtbench": ("turns",),
}
"""The key(s) a record of each shape must have."""
EXTRA_FIELDS = ("id", "question_id", "prompt_id", "category")
"""Scalar fields kept in Conversation.extra, so samples can be traced to benchmark questions."""

ROLES = {
    "system": "system", "developer": "developer",
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
    "bard": "assistant", "model": "assistant", "function_call": "assistant",
    "tool": "tool", "observation": "tool", "function_response": "tool",
}
"""Role (or ShareGPT `from`) names, lower-cased, to the OpenAI role they mean."""
SYSTEM_ROLES = ("system", "developer")
_SCALARS = (str, int, float, bool)


class BadRecord(ValueError):
    """What is wrong with one record; the caller adds the file and line."""


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
    paths: list[Path], *, fmt: str = "auto", partition_field: str | None = None,
    skip_bad_lines: bool = False,
) -> tuple[list[Conversation], LoadStats]:
    """Every record of every file, in file order, deduplicated (the first occurrence stays)."""
    _check_format(fmt)
    paths = [Path(p) for p in paths]
    for path in paths:
        _check_path(path)
    intake = _Intake(partition_field, skip_bad_lines)
    for path, default_partition in zip(paths, _file_partitions(paths), strict=True):
        _convert_records(_read_records(path), intake, fmt=fmt, label=str(path),
                         source=path.name, default_partition=default_partition)
    intake.finish()
    convs, duplicates = dedupe(intake.convs)
    stats = LoadStats(files=len(paths), records=len(intake.convs), bad_lines=intake.bad_lines,
                      duplicates=duplicates,
                      per_partition=dict(Counter(c.partition for c in convs)))
    return convs, stats


def load_hf_dataset(
    name_or_path: str, *, split: str = "train", fmt: str = "auto",
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
    intake = _Intake(partition_field, skip_bad_lines=False)
    _convert_records(enumerate(rows, 1), intake, fmt=fmt, label=name,
                     source=Path(name).name if local else name,
                     default_partition=Path(name).stem if local else name.rsplit("/", 1)[-1])
    intake.finish()
    return intake.convs


def select(
    convs: list[Conversation], *, partition: str | None = None, max_samples: int | None = None,
    shuffle_seed: int | None = None,
) -> list[Conversation]:
    """One partition (or all), optionally shuffled, then cut to max_samples in total."""
    if partition in (None, "all"):
        chosen = list(convs)
    else:
        chosen = [c for c in convs if c.partition == partition]
        if not chosen:
            known = ", ".join(dict.fromkeys(c.partition for c in convs)) or "none"
            raise UserError(f"--partition {partition}: no such partition "
                            f"(known: {known}, or all)")
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
    body = orjson.dumps([normalize(conv.messages), normalize(conv.tools or [])],
                        option=orjson.OPT_SORT_KEYS)
    return xxhash.xxh3_128_digest(body)


def detect_format(record: dict[str, Any]) -> str | None:
    """The shape of one record, or None when it has none of the known keys."""
    if "messages" in record:
        return "messages"
    if "conversations" in record:
        turns = record["conversations"]
        is_sharegpt = isinstance(turns, list) and turns and isinstance(turns[0], dict) \
            and "from" in turns[0]
        return "sharegpt" if is_sharegpt else "conversations"
    if "turns" in record:
        return "mtbench"
    if any(key in record for key in PROMPT_KEYS):
        return "prompt"
    return None


def to_conversation(record: object, fmt: str, *, source: str, line: int,
                    partition: str = "default") -> Conversation:
    """One record of the given shape as a Conversation; BadRecord says what is wrong."""
    if not isinstance(record, dict):
        raise BadRecord(f"expected a JSON object, got {type(record).__name__}")
    messages = _PARSERS[fmt](record)
    messages = _with_system(messages, record.get("system"))
    _check_order(messages)
    return Conversation(source=source, line=line, messages=messages, partition=partition,
                        tools=_tools(record.get("tools")), extra=_extra(record))


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
        raise UserError(f"{path}: expected a list of records, but the top-level object holds "
                        f"{what}")
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
        raise UserError(f"--dataset {name_or_path}: needs the datasets package: "
                        f"{HF_EXTRA}") from None
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
        raise UserError(f"--dataset {name_or_path} (split {split}): cannot load it "
                        f"({type(exc).__name__}: {exc})") from None


# Records to conversations ------------------------------------------------------------------
class _Intake:
    """Collects conversations and bad lines, and resolves missing partition values.

    A record without the partition field is an error at its line, unless no record has the
    field at all: then the flag is what is wrong, and the error names it.
    """

    def __init__(self, partition_field: str | None, skip_bad_lines: bool):
        self.partition_field = partition_field
        self.skip_bad_lines = skip_bad_lines
        self.convs: list[Conversation] = []
        self.bad_lines = 0
        self._field_seen = False
        self._lacking: list[str] = []  # where records lacked the field, before any had it

    def bad(self, where: str, why: str) -> None:
        if not self.skip_bad_lines:
            raise UserError(f"{where}: {why}")
        self.bad_lines += 1

    def add(self, conv: Conversation, where: str, value: str | None) -> None:
        """Keep conv, in the partition `value` names when a partition field is in use."""
        if self.partition_field is None:
            self.convs.append(conv)
            return
        if value is None:
            if self._field_seen:
                self.bad(where, self._lacks())
            else:
                self._lacking.append(where)
            return
        conv.partition = value
        self.convs.append(conv)
        if not self._field_seen:
            self._field_seen = True
            for earlier in self._lacking:
                self.bad(earlier, self._lacks())
            self._lacking.clear()

    def finish(self) -> None:
        if self._lacking:
            raise UserError(f"--partition-field {self.partition_field}: no record has a "
                            f"'{self.partition_field}' value")

    def _lacks(self) -> str:
        return f"no '{self.partition_field}' value (--partition-field)"


def _convert_records(records: Iterable[tuple[int, object]], intake: _Intake, *, fmt: str,
                     label: str, source: str, default_partition: str) -> None:
    """Every record of one file (or dataset) through the shape parsers into the intake."""
    shape, fixed_by = (None, "") if fmt == "auto" else (fmt, "--format")
    for line, record in records:
        where = f"{label}:{line}"
        if isinstance(record, BadRecord):
            intake.bad(where, str(record))
            continue
        try:
            record_shape = shape or _detect(record)
            _check_shape_key(record, record_shape, fixed_by)
            conv = to_conversation(record, record_shape, source=source, line=line,
                                   partition=default_partition)
            value = _partition_value(record, intake.partition_field)
        except BadRecord as exc:
            intake.bad(where, str(exc))
            continue
        if shape is None:
            shape, fixed_by = record_shape, f"detected at line {line}"
        intake.add(conv, where, value)


def _detect(record: object) -> str:
    if not isinstance(record, dict):
        raise BadRecord(f"expected a JSON object, got {type(record).__name__}")
    shape = detect_format(record)
    if shape is None:
        raise BadRecord("no recognizable shape (expected a 'messages', 'conversations', "
                        "'turns' or 'prompt' field)")
    return shape


def _check_shape_key(record: object, shape: str, fixed_by: str) -> None:
    if fixed_by and isinstance(record, dict) and not any(k in record for k in SHAPE_KEYS[shape]):
        keys = " or ".join(f"'{k}'" for k in SHAPE_KEYS[shape])
        raise BadRecord(f"no {keys} field (this file's shape is {shape}, {fixed_by})")


def _partition_value(record: object, partition_field: str | None) -> str | None:
    if partition_field is None or not isinstance(record, dict):
        return None
    value = record.get(partition_field)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, _SCALARS):
        raise BadRecord(f"'{partition_field}' must be a string or number to name a partition")
    return str(value).strip()


def _messages_shape(record: dict[str, Any]) -> list[dict[str, Any]]:
    return _message_list(record.get("messages"), "messages", "role", "content")


def _sharegpt_shape(record: dict[str, Any]) -> list[dict[str, Any]]:
    return _message_list(record.get("conversations"), "conversations", "from", "value")


def _conversations_shape(record: dict[str, Any]) -> list[dict[str, Any]]:
    return _message_list(record.get("conversations"), "conversations", "role", "content")


def _prompt_shape(record: dict[str, Any]) -> list[dict[str, Any]]:
    key = next((k for k in PROMPT_KEYS if record.get(k) is not None), PROMPT_KEYS[0])
    text = _nonblank_text(record.get(key), key)
    extra_input = record.get("input") if key == "instruction" else None
    if isinstance(extra_input, str) and extra_input.strip():
        text = f"{text}\n\n{extra_input}"  # alpaca's own prompt joins them the same way
    return [{"role": "user", "content": text}]


def _mtbench_shape(record: dict[str, Any]) -> list[dict[str, Any]]:
    turns = record.get("turns")
    if not isinstance(turns, list):
        raise BadRecord("'turns' must be a list of strings")
    if not turns:
        raise BadRecord("empty conversation ('turns' is empty)")
    messages: list[dict[str, Any]] = []
    for number, turn in enumerate(turns, 1):
        if messages:  # the placeholder marks the previous turn as one to generate
            messages.append({"role": "assistant", "content": None})
        messages.append({"role": "user", "content": _nonblank_text(turn, f"turn {number}")})
    return messages


_PARSERS = {
    "messages": _messages_shape,
    "sharegpt": _sharegpt_shape,
    "conversations": _conversations_shape,
    "prompt": _prompt_shape,
    "mtbench": _mtbench_shape,
}


def _nonblank_text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise BadRecord(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise BadRecord(f"empty conversation ({what} is blank)")
    return value


def _message_list(value: object, key: str, role_key: str, content_key: str) -> list[dict]:
    if not isinstance(value, list):
        raise BadRecord(f"'{key}' must be a list of messages, got {type(value).__name__}")
    if not value:
        raise BadRecord(f"empty conversation ('{key}' is empty)")
    return [_message(raw, number, role_key, content_key) for number, raw in enumerate(value, 1)]


def _message(raw: object, number: int, role_key: str, content_key: str) -> dict[str, Any]:
    """One message in OpenAI form, keeping only the keys chat templates read."""
    if not isinstance(raw, dict):
        raise BadRecord(f"message {number}: expected an object, got {type(raw).__name__}")
    name = raw.get(role_key)
    if not isinstance(name, str):
        raise BadRecord(f"message {number}: no '{role_key}' string")
    role = ROLES.get(name.strip().lower())
    if role is None:
        raise BadRecord(f"message {number}: unknown {role_key} {name!r}")
    message = {"role": role, "content": _content(raw.get(content_key), role, number, content_key)}
    if role == "assistant":
        message.update(_assistant_fields(raw, number))
    for key in ("tool_call_id", "name") if role == "tool" else ("name",):
        if isinstance(raw.get(key), str):
            message[key] = raw[key]
    return message


def _content(value: object, role: str, number: int, key: str) -> str | None:
    if isinstance(value, str):
        return value
    if value is None and role == "assistant":  # tool-call-only turns and placeholders
        return None
    if isinstance(value, list) and all(_is_text_part(p) for p in value):
        return "".join(part["text"] for part in value)
    raise BadRecord(f"message {number}: '{key}' must be a string (or a list of text parts), "
                    f"got {type(value).__name__}")


def _is_text_part(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" \
        and isinstance(part.get("text"), str)


def _assistant_fields(raw: dict[str, Any], number: int) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    # Servers name the reasoning `reasoning_content` or `reasoning`; gen reads one name only.
    reasoning = raw.get("reasoning_content")
    if reasoning is None:
        reasoning = raw.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, str):
            raise BadRecord(f"message {number}: reasoning must be a string")
        fields["reasoning_content"] = reasoning
    calls = raw.get("tool_calls")
    if calls is not None and calls != []:
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise BadRecord(f"message {number}: 'tool_calls' must be a list of objects")
        fields["tool_calls"] = calls
    return fields


def _with_system(messages: list[dict[str, Any]], system: object) -> list[dict[str, Any]]:
    if system is None or (isinstance(system, str) and not system.strip()):
        return messages
    if not isinstance(system, str):
        raise BadRecord("'system' must be a string")
    if messages[0]["role"] in SYSTEM_ROLES:
        return messages
    return [{"role": "system", "content": system}, *messages]


def _check_order(messages: list[dict[str, Any]]) -> None:
    """Roles in an order that gives every generation point a prompt (see the module doc)."""
    start = next((i for i, m in enumerate(messages) if m["role"] not in SYSTEM_ROLES), None)
    if start is None:
        raise BadRecord("no user message, so nothing to generate from")
    if messages[start]["role"] != "user":
        raise BadRecord(f"message {start + 1}: the conversation must start with a user "
                        f"message, not {messages[start]['role']}")
    for number, (prev, cur) in enumerate(pairwise(messages), 2):
        if cur["role"] == "tool" and prev["role"] not in ("assistant", "tool"):
            raise BadRecord(f"message {number}: a tool result must follow an assistant message "
                            f"or another tool result, not {prev['role']}")
        if cur["role"] == "assistant" and prev["role"] == "assistant":
            raise BadRecord(f"message {number}: two assistant messages in a row")


def _tools(value: object) -> list[dict[str, Any]] | None:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):  # hermes and LLaMA-Factory store the list as a JSON string
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise BadRecord("'tools' is a string but not JSON") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise BadRecord("'tools' must be a list of objects")
    return value or None


def _extra(record: dict[str, Any]) -> dict[str, Any]:
    return {key: record[key] for key in EXTRA_FIELDS
            if isinstance(record.get(key), _SCALARS) and record[key] != ""}
