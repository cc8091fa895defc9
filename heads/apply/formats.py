"""The export-format registry, torch-free so the command line can offer its choices without loading torch:
format name -> the writer in heads.apply.export (writer(head, out dir, encoder override) -> summary).
A new format is one writer in export.py and one line here."""
from __future__ import annotations

EXPORT_FORMATS: dict[str, str] = {
    "sentence-transformers": "export_sentence_transformers",  # stock modules, encoder included
    "safetensors": "export_safetensors",  # a head directory headstore.Head.load reads
}
