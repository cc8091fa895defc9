"""Where the real data sets live, and the general text `cli compare` / `cli forgetting` score MLM loss on.

The root is `$HEADSTORE_DATA`, else `<repo>/../shared/datasets`: the same rule as the tests'
`real_dataset` fixture (tests/heads/conftest.py), so what the tests find the commands find. Without
`mlm_text` the commands take wikitext-2 from there; when that file is missing they say so (the line of
`missing_mlm_text_note`, naming the path looked for) and leave the general-MLM figures out.
"""
from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "HEADSTORE_DATA"
GENERAL_MLM_TEXT = Path("wikitext-2") / "wikitext2.parquet"  # under the root: general text for MLM loss


def datasets_root() -> Path:
    """`$HEADSTORE_DATA`, else the `shared/datasets` folder beside the repository."""
    repo = Path(__file__).resolve().parents[3]  # compare/ -> experiments/ -> heads/ -> the repository root
    return Path(os.environ.get(DATA_ENV, repo.parent / "shared" / "datasets"))


def default_mlm_text_path() -> Path:
    """The general MLM text looked for when none is given (it may not exist)."""
    return datasets_root() / GENERAL_MLM_TEXT


def default_mlm_text() -> str | None:
    """The default general MLM text as a string, or None when the file is absent."""
    path = default_mlm_text_path()
    return str(path) if path.is_file() else None


def missing_mlm_text_note(mlm: bool, mlm_text: str | None) -> str | None:
    """The line to show when MLM loss is asked for but there is no general text; None otherwise."""
    if not mlm or mlm_text:
        return None
    return (f"no general MLM text: {default_mlm_text_path()} not found (set ${DATA_ENV} or give mlm_text); "
            "the general-text MLM loss is left out")
