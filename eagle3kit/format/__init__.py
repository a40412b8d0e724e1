"""The on-disk dataset format: the only code that reads or writes shards and manifests.

See docs/format.md for the specification.
"""

from eagle3kit.format.dataset_dir import is_dataset, own_manifest
from eagle3kit.format.errors import DatasetError
from eagle3kit.format.hidden import (
    HiddenDataset,
    HiddenSample,
    HiddenWriter,
    hidden_bytes_per_token,
)
from eagle3kit.format.layout import FORMAT_NAME, FORMAT_VERSION
from eagle3kit.format.reader import Dataset, ShardColumns, TokenView
from eagle3kit.format.sample import TokenSample, make_sample_id
from eagle3kit.format.writer import DatasetWriter, OpenMode

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Dataset",
    "DatasetError",
    "DatasetWriter",
    "HiddenDataset",
    "HiddenSample",
    "HiddenWriter",
    "OpenMode",
    "ShardColumns",
    "TokenSample",
    "TokenView",
    "hidden_bytes_per_token",
    "is_dataset",
    "make_sample_id",
    "own_manifest",
]
