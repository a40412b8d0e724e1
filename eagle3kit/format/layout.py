"""Names and numbers that define a dataset directory on disk (see docs/format.md)."""

from __future__ import annotations

import re

FORMAT_NAME = "eagle3kit-dataset"
# Bump when a reader of the previous version could misread the new layout; readers refuse newer.
FORMAT_VERSION = 1
# The first eagle3kit release able to read each format version, for the "upgrade to" message.
FIRST_READER = {1: "0.1.0"}
KINDS = ("tokens", "hidden")

MARKER = "eagle3kit.json"
MANIFEST = "manifest.json"
SHARD_DIR = "shards"
SHARD_SUFFIX = ".safetensors"
TMP_SUFFIX = ".tmp"
# The only names a writer gives shards (r<rank>-<8 hex>-<sequence>): the only files in shards/
# a writer ever removes, when no commit names them.
SHARD_NAME = re.compile(r"r\d+-[0-9a-f]{8}-\d{6,}\.safetensors")
# Temp names: `<shard name>.tmp` in shards/, `<file>.<pid>.tmp` beside the JSON files and in
# the attached folders (eagle3kit/format/_io.py tmp_path).
SHARD_TMP_NAME = re.compile(SHARD_NAME.pattern + r"\.tmp")
PID_TMP_SUFFIX = re.compile(r"\.\d+\.tmp")
# Held (flock) by every process of the run that owns the dataset; the kernel drops it on death.
RUN_LOCK = ".run.lock"
# Serializes lock acquisition, so a run's first writer can set up before others join.
GATE_LOCK = ".gate.lock"
# Serializes manifest commits between the ranks of one run.
COMMIT_LOCK = ".commit.lock"
OWNER = ".owner.json"
OWN_FILES = (MARKER, MANIFEST, RUN_LOCK, GATE_LOCK, COMMIT_LOCK, OWNER)
# The tokenizer and chat template gen used, stored beside the data (Dataset.tokenizer_dir).
TOKENIZER_DIR = "tokenizer"
# Folders of files a stage stores beside the data (DatasetWriter.store_files).
ATTACHED_DIRS = (TOKENIZER_DIR,)
