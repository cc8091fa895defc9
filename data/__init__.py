"""Dataset readers: BEIR, STS, pairs and plain text into validated polars frames."""

from headstore.data.beir import BeirData, read_beir
from headstore.data.dataset import FORMATS, Dataset, detect_format, load_dataset
from headstore.data.errors import DataError
from headstore.data.readers import read_pairs, read_sts, read_text
from headstore.data.text_id import doc_text, text_id, text_ids

__all__ = ["FORMATS", "BeirData", "DataError", "Dataset", "detect_format", "doc_text", "load_dataset",
           "read_beir", "read_pairs", "read_sts", "read_text", "text_id", "text_ids"]
