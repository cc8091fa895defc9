"""The BEIR folder reader (IR): ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv`` -> ``read_beir``.

Bad input raises ``DataError`` naming the file, the line (1-based, header counted) and the problem, as the
other readers do (data.readers); the only things skipped are blank lines. Documents with an empty title and
text are kept (qrels may judge them) and counted in a warning; negative grades are kept and read as
non-relevant, as trec_eval reads them. Every case is listed in docs/bad-input.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from headstore.data.errors import DataError
from headstore.data.tables import SPLIT_HELP, canonical_split, read_jsonl_objects, read_lines

log = logging.getLogger(__name__)

QRELS_HEADER = ("query-id", "corpus-id", "score")
# trec_eval reads grades as C ints; a grade beyond this is a corrupt file, not a judgement
MAX_GRADE = 2**31 - 1


@dataclass(frozen=True)
class BeirData:
    corpus: pl.DataFrame  # _id, title, text (all String)
    queries: pl.DataFrame  # _id, text
    qrels: dict[str, pl.DataFrame]  # split -> query_id, corpus_id, score (Int64)
    path: Path = field(default=Path("."))


def _string_id(path: Path, line: int, obj: dict) -> str:
    if "_id" not in obj:
        raise DataError(path, 'missing "_id"', line=line)
    value = obj["_id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(path, f'"_id" must be a string or integer, got {value!r}', line=line)
    value = str(value)  # ids are strings: qrels refer to them as text
    if not value.strip():
        raise DataError(path, '"_id" is empty', line=line)
    return value


def _string_field(path: Path, line: int, obj: dict, key: str, required: bool) -> str:
    if key not in obj or obj[key] is None:
        if required:
            raise DataError(path, f'missing "{key}"', line=line)
        return ""
    value = obj[key]
    if not isinstance(value, str):
        raise DataError(path, f'"{key}" must be a string, got {type(value).__name__}', line=line)
    if "\x00" in value:
        raise DataError(path, f'"{key}" contains a NUL character (\\u0000) (remove it)', line=line)
    return value


def _read_beir_jsonl(path: Path, with_title: bool) -> tuple[pl.DataFrame, dict[str, int]]:
    if not path.is_file():
        raise DataError(path, "no such file (a BEIR folder needs corpus.jsonl and queries.jsonl)")
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    line_of: dict[str, int] = {}
    empty_docs: list[int] = []
    for line, obj in read_jsonl_objects(path):
        _id = _string_id(path, line, obj)
        if _id in line_of:
            raise DataError(path, f'duplicate "_id" {_id!r} (first at line {line_of[_id]})', line=line)
        line_of[_id] = line
        text = _string_field(path, line, obj, "text", required=True)
        title = _string_field(path, line, obj, "title", required=False) if with_title else ""
        if not (title + text).strip():
            if not with_title:  # a query with no text cannot be asked
                raise DataError(path, f"query {_id!r} has empty text", line=line)
            empty_docs.append(line)
        ids.append(_id)
        titles.append(title)
        texts.append(text)
    if not ids:
        raise DataError(path, f"no {'documents' if with_title else 'queries'}: the file is empty or blank")
    if empty_docs:  # kept: qrels may judge them (Cranfield 471, 995), and they encode as ""
        log.warning("%s: %d document(s) with empty title and text (line %s%s)", path,
                    len(empty_docs), ", ".join(map(str, empty_docs[:5])),
                    ", ..." if len(empty_docs) > 5 else "")
    columns = {"_id": ids, "title": titles, "text": texts} if with_title else {"_id": ids, "text": texts}
    frame = pl.DataFrame({k: pl.Series(k, v, dtype=pl.String) for k, v in columns.items()})
    return frame, line_of


def _read_qrels(path: Path, query_ids: dict, corpus_ids: dict) -> pl.DataFrame:
    query_col: list[str] = []
    corpus_col: list[str] = []
    scores: list[int] = []
    seen: dict[tuple[str, str], int] = {}
    negative: list[int] = []
    lines = read_lines(path)
    header = next(lines, (1, ""))[1]
    if tuple(header.split("\t")) != QRELS_HEADER:
        raise DataError(path, f"expected the header {chr(9).join(QRELS_HEADER)!r} (tab separated), "
                        f"got {header!r}", line=1)
    for line, row in lines:
        if not row.strip():
            continue
        fields = row.split("\t")
        if len(fields) != 3:
            raise DataError(path, f"expected 3 tab-separated fields (query-id, corpus-id, score), "
                            f"got {len(fields)}: {row!r}", line=line)
        qid, did, score = (f.strip() for f in fields)
        try:
            score_int = int(score)
        except ValueError:
            raise DataError(path, f"score must be an integer, got {score!r}", line=line) from None
        if abs(score_int) > MAX_GRADE:
            raise DataError(path, f"grade {score} is out of range (|grade| <= {MAX_GRADE}, as trec_eval "
                            "reads it) (use small integer grades: 0 non-relevant, 1, 2, ... relevant)",
                            line=line)
        if score_int < 0:
            negative.append(line)
        if qid not in query_ids:
            raise DataError(path, f"query id {qid!r} is not in queries.jsonl", line=line)
        if did not in corpus_ids:
            raise DataError(path, f"corpus id {did!r} is not in corpus.jsonl", line=line)
        if (qid, did) in seen:
            raise DataError(path, f"duplicate judgement for query {qid!r}, document {did!r} "
                            f"(first at line {seen[qid, did]})", line=line)
        seen[qid, did] = line
        query_col.append(qid)
        corpus_col.append(did)
        scores.append(score_int)
    if not scores:
        raise DataError(path, "no judgements (only a header) (add rows or remove the file)")
    if negative:  # kept and counted: trec_eval reads them as non-relevant (gain 0), and so do we
        log.warning("%s: %d judgement(s) with a negative grade, read as non-relevant (line %s%s)", path,
                    len(negative), ", ".join(map(str, negative[:5])), ", ..." if len(negative) > 5 else "")
    return pl.DataFrame({"query_id": pl.Series(query_col, dtype=pl.String),
                         "corpus_id": pl.Series(corpus_col, dtype=pl.String),
                         "score": pl.Series(scores, dtype=pl.Int64)})


def read_beir(folder: str | Path) -> BeirData:
    """Read a BEIR-layout folder. Ids become strings; a missing title reads as ""."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(folder, "not a folder (a BEIR dataset is a folder holding corpus.jsonl)")
    corpus, corpus_ids = _read_beir_jsonl(folder / "corpus.jsonl", with_title=True)
    queries, query_ids = _read_beir_jsonl(folder / "queries.jsonl", with_title=False)
    qrels_files = sorted((folder / "qrels").glob("*.tsv"))
    if not qrels_files:
        log.warning("%s: no qrels/<split>.tsv files; the dataset has no relevance judgements", folder)
    qrels: dict[str, pl.DataFrame] = {}
    file_of: dict[str, Path] = {}
    for p in qrels_files:
        split = canonical_split(p.stem)
        if split is None:
            found = ", ".join(q.name for q in qrels_files)
            raise DataError(p, f"split {p.stem!r} is not recognised; the qrels files are {found} ({SPLIT_HELP})")
        if split in file_of:
            raise DataError(p, f"split {split!r} is also given by {file_of[split].name} (keep one of them)")
        file_of[split] = p
        qrels[split] = _read_qrels(p, query_ids, corpus_ids)
    return BeirData(corpus=corpus, queries=queries, qrels=qrels, path=folder)
