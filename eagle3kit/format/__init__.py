"""The on-disk dataset format: the only code that reads or writes shards and manifests.

Code outside format/ imports these names from here, never a module inside it (the public
view; ruff's banned-api rule and tests/test_architecture.py hold that).

See docs/format.md for the specification.
"""

from eagle3kit.format._ints import Int32RangeError, pack_int32_into
from eagle3kit.format.columns import ShardColumns, TokenView
from eagle3kit.format.dataset_dir import has_dataset_files, is_dataset, own_manifest, read_marker
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.hidden import CODECS, HiddenSample, hidden_bytes_per_token
from eagle3kit.format.hidden_reader import HiddenDataset, committed_ids
from eagle3kit.format.hidden_writer import HiddenWriter
from eagle3kit.format.layout import FORMAT_NAME, FORMAT_VERSION
from eagle3kit.format.lock import new_run_id
from eagle3kit.format.reader import Dataset
from eagle3kit.format.recorded import Origin, Recorded
from eagle3kit.format.sample import MAX_SAMPLE_TOKENS, TokenSample, make_sample_id, normalize
from eagle3kit.format.shard import meta_bound
from eagle3kit.format.writer import DatasetWriter, OpenMode

__all__ = [
    "CODECS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_SAMPLE_TOKENS",
    "Dataset",
    "DatasetError",
    "DatasetWriter",
    "HiddenDataset",
    "HiddenSample",
    "HiddenWriter",
    "Int32RangeError",
    "OpenMode",
    "Origin",
    "Recorded",
    "ShardColumns",
    "TokenSample",
    "TokenView",
    "committed_ids",
    "has_dataset_files",
    "hidden_bytes_per_token",
    "is_dataset",
    "make_sample_id",
    "meta_bound",
    "new_run_id",
    "normalize",
    "own_manifest",
    "pack_int32_into",
    "read_marker",
]
