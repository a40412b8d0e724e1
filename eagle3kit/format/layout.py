"""Names and numbers that define a dataset directory on disk (see docs/format.md)."""

from __future__ import annotations

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
# Held (flock) by every process of the run that owns the dataset; the kernel drops it on death.
RUN_LOCK = ".run.lock"
# Serializes lock acquisition, so a run's first writer can set up before others join.
GATE_LOCK = ".gate.lock"
# Serializes manifest commits between the ranks of one run.
COMMIT_LOCK = ".commit.lock"
OWNER = ".owner.json"
OWN_FILES = (MARKER, MANIFEST, RUN_LOCK, GATE_LOCK, COMMIT_LOCK, OWNER)
# Folders of files a stage stores beside the data (DatasetWriter.store_files).
ATTACHED_DIRS = ("tokenizer",)
