"""What an exported model cannot carry, written beside it (`cli export`): the document memory (per-document vectors)
and the lexical channel's settings (BM25 needs the corpus: a ranking's property, not a model's)."""
from __future__ import annotations

import shutil
from pathlib import Path

from headstore.heads.artefacts.memory import MEMORY_FILE
from headstore.heads.training.lexical_fit import LEXICAL_FILE


def write_beside(head, ref: str, fmt: str, out: Path) -> list[str]:
    """The notes of what was written beside a `fmt` export of `head` (from `ref`) in `out`."""
    notes = []
    if head.memory is not None and fmt != "safetensors":  # (a safetensors head folder carries it: Head.save)
        head.memory.save(out / MEMORY_FILE)
        notes.append(f"a {fmt} model cannot carry per-document vectors: the head's document memory ({len(head.memory)} "
                     f"documents) is written beside it, {out / MEMORY_FILE} (text ids -> vectors; docs/memory.md loads it)")
    lexical = Path(ref) / LEXICAL_FILE
    if lexical.is_file():
        shutil.copyfile(lexical, out / LEXICAL_FILE)
        notes.append(f"a {fmt} model has no corpus to run BM25 on: the head's lexical channel (its weight and the "
                     f"memory's gain) is written beside it, {out / LEXICAL_FILE}; `cli index` / `cli search` fuse it "
                     "(docs/memory.md#lexical-fusion)")
    return notes
