"""`cli export`, `cli index`, `cli search`: a trained head used outside training (registered by cli.py)."""
from __future__ import annotations

import click

from headstore.data.files import atomic_write_json
from headstore.data.options import PATH, fold_label_options, format_option, label_options, unlabeled_option
from headstore.data.readers import read_text
from headstore.heads.apply.formats import EXPORT_FORMATS

# The implementations (torch, FAISS, sentence-transformers) are imported when a command runs, so that
# `import headstore.cli` stays cheap.


def _head_ref(head: str | None, grid: str | None, rank: int | None, head_id: str | None,
              ensemble: int | None = None) -> str:
    """The Head.load reference the options name (exactly one of --head and --grid)."""
    if (head is None) == (grid is None):
        raise click.UsageError("give either --head (a train-head dir or GRID#rank=K) or --grid with --rank/--id/--ensemble")
    if head is not None:
        if rank is not None or head_id is not None or ensemble is not None:
            raise click.UsageError("--rank, --id and --ensemble select from --grid; with --head write HEAD#rank=K")
        return head
    if sum(x is not None for x in (rank, head_id, ensemble)) > 1:
        raise click.UsageError("give one of --rank, --id and --ensemble")
    if ensemble is not None:
        if ensemble < 1:
            raise click.UsageError(f"--ensemble {ensemble}: give the number of configurations, >= 1")
        return f"{grid}#ensemble={ensemble}"
    return f"{grid}#id={head_id}" if head_id is not None else f"{grid}#rank={1 if rank is None else rank}"


@click.command("export")
@click.option("--head", "head", type=PATH, default=None, help="A `cli train-head --out` dir (or GRID#rank=K, GRID#id=HEAD_ID).")
@click.option("--grid", "grid", type=PATH, default=None, help="A `cli grid --out` dir: export its --rank (default 1) or --id head.")
@click.option("--rank", type=int, default=None, help="With --grid: the leaderboard rank (selected on dev).")
@click.option("--id", "head_id", default=None, help="With --grid: a head_id from its results.csv.")
@click.option("--ensemble", type=int, default=None,
              help="With --grid: one head averaging the L1 energies of the K best configurations (best-dev seed each).")
@click.option("--format", "fmt", type=click.Choice(sorted(EXPORT_FORMATS)), required=True,
              help="sentence-transformers: a model dir plain SentenceTransformer(DIR) loads; "
                   "safetensors: head + normaliser + config.json (headstore.Head.load).")
@click.option("--out", type=PATH, required=True, help="New (or empty) output directory.")
@click.option("--model", type=PATH, default=None, help="The encoder the head's store was featurized with (default: found "
                                            "from the store; checked against its fingerprint).")
def export_command(head, grid, rank, head_id, ensemble, fmt, out, model):
    """Export one trained head, or an ensemble of a grid's best as one head (encoder included for
    sentence-transformers), to OUT."""
    from headstore.heads.apply.export import export_head

    ref = _head_ref(head, grid, rank, head_id, ensemble)
    summary = export_head(ref, fmt, out, model)
    click.echo(f"exported {ref} -> {summary['out']} ({fmt})")
    if "modules" in summary:
        click.echo(f"modules: {' -> '.join(summary['modules'])}; similarity: {summary['similarity_fn_name']}")
    for note in summary.get("notes", []):
        click.echo(f"note: {note}")
    click.echo(f"load with: {summary['load']}")


@click.command("index")
@click.option("--store", type=PATH, required=True, help="The feature store the head was trained on.")
@click.option("--head", "head", type=PATH, required=True, help="A train-head dir, GRID#rank=K or GRID#id=HEAD_ID.")
@click.option("--data", type=PATH, default=None,
              help="Corpus to index: a BEIR folder (its corpus) or any dataset (its texts); beside --unlabeled, or "
                   "none.")
@format_option
@unlabeled_option
@click.option("--out", type=PATH, required=True, help="New (or empty) index directory.")
@click.option("--hnsw", type=int, default=None, help="Approximate HNSW index with M links per node (default: exact flat).")
@click.option("--ef-construction", type=int, default=80, show_default=True, help="HNSW build beam.")
@label_options
def index_command(store, head, data, data_format, unlabeled, out, hnsw, ef_construction, **label_settings):
    """Put the head's outputs of a corpus (from stored features, in the document role) into a FAISS index for
    `cli search`."""
    from headstore.heads.apply.search import build_index

    data_format = fold_label_options(data_format, label_settings)
    info = build_index(store, head, data, out, hnsw, data_format, ef_construction, unlabeled=tuple(unlabeled))
    kind = f"HNSW (M={info['hnsw_m']})" if info["kind"] == "hnsw" else "flat (exact)"
    click.echo(f"{out}: {info['n']} vectors of dim {info['dim']}, {kind}, {info['metric']} ({info['energy']} energy)")
    judged = info["judged"]
    click.echo(f"seen / unseen: {judged['documents']:,} of the {judged['of']:,} documents were judged in the head's "
               f"training (seen), {judged['of'] - judged['documents']:,} are new to it (unseen)"
               if "documents" in judged else f"seen / unseen: {judged['note']}")
    if "lexical" in info:
        lx = info["lexical"]
        click.echo(f"lexical: BM25 beside it at weight {lx['weight']:g} (" + (
            "a corpus none of whose documents the training judged: the head's weight_new"
            if lx["judged_documents"] == 0 else "the head's dev weight") + f"), memory gain {lx['gain']:g}")


@click.command("search")
@click.option("--index", "index_dir", type=PATH, required=True, help="A `cli index --out` directory.")
@click.option("--query", "queries", multiple=True, help="A query text (repeatable).")
@click.option("--queries", "queries_file", type=PATH, default=None, help="File of queries: .txt (one per line) or Parquet text column.")
@click.option("--k", type=int, default=10, show_default=True, help="Results per query.")
@click.option("--model", type=PATH, default=None, help="Encoder override (default: the head's store's encoder).")
@click.option("--ef-search", type=int, default=64, show_default=True, help="HNSW query beam (ignored for flat).")
@click.option("--head", type=PATH, default=None,
              help="Search with another query-side head (--sides query) whose documents lie where the index's do "
                   "(same store, array, normaliser, energy): one corpus index serves every such head.")
@click.option("--no-lexical", "no_lexical", is_flag=True,
              help="Rank by the head alone where the index holds BM25 beside it (IDX/lexical: the head's lexical.json).")
@click.option("--out", type=PATH, default=None, help="Also write every result to this JSON file.")
def search_command(index_dir, queries, queries_file, k, model, ef_search, head, no_lexical, out):
    """Encode queries with the head's encoder and head, and list the k lowest-energy items of the index (or, where
    the index holds the head's BM25 channel, the k best by the fused score, as eval ranks)."""
    from headstore.heads.apply.search import SearchIndex, results_table

    texts = list(queries)
    if queries_file:
        texts += read_text(queries_file)["text"].to_list()
    if not texts:
        raise click.UsageError("give --query TEXT (repeatable) or --queries FILE")
    index = SearchIndex(index_dir, ef_search=ef_search, head=head, lexical=not no_lexical)
    results = index.search(texts, k, model)
    for note in index.notes:
        click.echo(f"note: {note}", err=True)
    for text, hits in zip(texts, results):
        click.echo(results_table(text, hits) + "\n")
    if out:
        atomic_write_json(out, [{"query": q, "hits": h} for q, h in zip(texts, results)])
        click.echo(f"wrote {out}")
