"""A run's input windows, shared by both engines: the new texts of each window (`new_windows`, where a rerun
resumes), the run's encoder (`open_encoder`) and their features in plan order (`encode_in_plan_order`: tokenised,
planned longest first, encoded, checked finite before anything is committed)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from headstore.featurize.encoder.backends import AUTO, Choice, choose_backend, use_backend
from headstore.featurize.encoder.encode import (Batch, Tokenized, encode_batch, features_to_host, plan_batches,
                                                prefetch_batches, prompt_length, tokenize)
from headstore.featurize.encoder.model import open_model
from headstore.featurize.encoder.packed import prepare_encoder
from headstore.featurize.encoder.pooling import Pooler
from headstore.featurize.encoder.resolved import ResolvedSettings
from headstore.featurize.run.plan import Plan
from headstore.featurize.run.source import windows
from headstore.featurize.store.layout import array_names
from headstore.featurize.store.reader import finite_rows


def new_windows(plan: Plan, chunks: Iterable[tuple[str, list[str]]],
                counts: dict) -> Iterator[tuple[str, list[str], list[str]]]:
    """The window loop of both engines: (prompt, row ids, texts) of each input window's texts that are
    neither stored nor earlier in the input, in input order; counts n_input_texts and n_windows. Chunks
    come by role; a window holds texts of one prompt (roles that share a prompt share windows).

    This is where a rerun resumes: texts an earlier run committed are in plan.stored and never
    yielded. At the first window with new texts the store is locked (plan.open_writer) and the
    window looked at again, as another writer may have committed some of its texts meanwhile; a run
    with nothing new never opens (nor creates) the store."""
    by_prompt = ((plan.prompt(role), chunk) for role, chunk in chunks)
    for prompt, window in windows(by_prompt, plan.settings.window_texts):
        counts["n_input_texts"] += len(window)
        counts["n_windows"] += 1
        new_ids, new_texts, keys = plan.new_in_window(window, prompt)
        if not new_ids:
            continue
        if plan.writer is None:
            plan.open_writer()
            new_ids, new_texts, keys = plan.new_in_window(window, prompt)  # another writer's rows
        plan.added.add(keys)
        yield prompt, new_ids, new_texts


def open_encoder(settings: ResolvedSettings, n_chars: int | None = None) -> tuple:
    """(the run's encoder, its forward in the backend chosen once for the run; that Choice). The numerics are set
    on the torch model first (prepare_encoder reads its forward, casts its weights), then a runtime may replace its
    forward. auto weighs `n_chars` characters of new text against building a missing export (None: only a cached
    one; featurize.encoder.backends.choose_backend). Both engines open theirs so (a Ray actor
    in its process)."""
    s = settings
    encoder = open_model(s.identity, s.device)
    path = prepare_encoder(encoder, s.numerics, s.packing)
    choice = (choose_backend(encoder, s.layers, s.precision, path.packing, s.num_threads, s.export_cache, n_chars)
              if s.backend == AUTO else Choice(s.backend, "given (--backend)"))
    return use_backend(encoder, choice.backend, s.layers, s.precision,  # torch: itself
                       s.num_threads, s.export_cache), choice


def encode_in_plan_order(settings: ResolvedSettings, encoder, ids: list[str], texts: list[str],
                         prompts: str | list[str] = "") -> Iterator[tuple[np.ndarray, dict, Tokenized, Batch]]:
    """Tokenise prompt + text (as sentence-transformers does) and plan the texts (longest first), encode
    batch by batch: yields (indices into texts, {array name: (B, D) features in the store dtype}, the
    tokenisation, the batch). `prompts`: one prompt for every text, or one per text."""
    names = list(array_names(settings.layers))
    np_dtype = np.dtype(settings.dtype)
    # numerics, packing: once per encoder
    path = encoder.path or prepare_encoder(encoder, settings.numerics, settings.packing)
    prompts = [prompts] * len(texts) if isinstance(prompts, str) else list(prompts)
    tok = tokenize(encoder.tokenizer, [p + t for p, t in zip(prompts, texts)], encoder.max_length,
                   threads=settings.tokenize_threads)
    prompt_lengths = torch.as_tensor([prompt_length(encoder.tokenizer, p) for p in prompts], dtype=torch.int64)
    order, batches = plan_batches(tok.n_tokens, ids, settings.batch_tokens, settings.max_batch_size,
                                  batch_overhead_tokens=settings.batch_overhead_tokens,
                                  attention_width=6 * encoder.model.config.hidden_size, packed=path.packing)
    pad_id = encoder.tokenizer.pad_token_id or 0
    pooler = Pooler.of(settings.spec, encoder.identity.model_dir)
    # CPU: collate inline (the cores are busy with the forward); GPU: in a background thread
    depth = 4 if settings.cuda else 0

    def pooled_batches():
        for batch in prefetch_batches(tok, order, batches, pad_id, pin=settings.cuda, depth=depth,
                                      packed=path.packing):
            lengths = prompt_lengths[order[batch.start: batch.start + batch.n_texts]]  # (B,)
            yield batch, encode_batch(encoder, batch, pooler, settings.layers, path.autocast, lengths)  # [(B, D)]

    for batch, host in features_to_host(pooled_batches(), cuda=settings.cuda):
        with np.errstate(over="ignore"):  # a float16 overflow is refused just below, naming the text
            feats = {name: h.astype(np_dtype, copy=False) for name, h in zip(names, host)}
        check_finite(feats, host, order[batch.start: batch.start + batch.n_texts], ids, texts)
        yield order[batch.start: batch.start + batch.n_texts], feats, tok, batch


def check_finite(feats: dict[str, np.ndarray], host: list[np.ndarray], idx: np.ndarray, ids: list[str],
                 texts: list[str]) -> None:
    """ValueError naming the first text of a batch whose features hold NaN/inf, before anything of the batch is
    committed (a later read would refuse the rows): a float16 overflow (|x| > 65504) or the encoder's own."""
    for (name, f), h in zip(feats.items(), host):  # f: (B, D) in the store dtype, h: the same in float32
        bad = ~finite_rows(f)
        if bad.any():
            i = int(idx[int(np.argmax(bad))])
            text = texts[i] if len(texts[i]) <= 60 else texts[i][:57] + "..."
            why = ("its features exceed float16's range (|x| > 65504): featurize into a store with --dtype float32"
                   if finite_rows(h)[int(np.argmax(bad))] else
                   "the encoder gives NaN/inf for it (check the model's weights, or --precision fp32)")
            raise ValueError(f"text {ids[i]} ({text!r}): {name}: {why} ({int(bad.sum())} of its batch's {len(bad)} "
                             "texts likewise; nothing of the batch was stored)")
