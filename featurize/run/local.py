"""One featurize run, streamed, in the local engine: input windows -> texts not yet stored -> encoder ->
committed segments.

The input is read in windows of `window_texts` texts (source.py). In each window the texts whose id is neither
in the store nor earlier in the input (windows.py) are tokenised, planned longest-first (encoder/encode.py)
and encoded; a writer thread commits segments as they finish (committer.py). Memory is one window plus the ids
(16 bytes per text, store/ids.py), whatever the corpus size. Window boundaries depend on the input alone and a
window's plan on its texts alone, so after a crash the rerun skips committed texts, re-plans the interrupted
window's rest exactly as the first run would have, and gives every text the same row and bit-identical
features. The store and the encoder are opened only when a window has new texts: an up-to-date store (even a
read-only one) is never written, and an empty input never creates a store.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from headstore.data.progress import progress_bar, progress_write
from headstore.data.text_id import ROLES
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.hardware import bf16_note
from headstore.featurize.encoder.model import encoding_settings
from headstore.featurize.encoder.resolved import ResolvedSettings
from headstore.featurize.run.committer import Committer
from headstore.featurize.run.plan import Plan
from headstore.featurize.run.source import all_chunks, open_sources
from headstore.featurize.run.windows import encode_in_plan_order, new_windows, open_encoder


def featurize(config: FeaturizeConfig, data_paths: Sequence[str | Path], store_path: str | Path,
              formats: Sequence[str | None] | None = None, unlabeled: Sequence[str | Path] = ()) -> dict:
    """Encode every text of the datasets (and of the `unlabeled` files, data.unlabeled: documents) that the store
    does not hold yet; returns a summary."""
    plan = Plan.make(config, store_path)  # resolves the settings, refuses bad ones before anything is read or created
    sources = open_sources(data_paths, formats, unlabeled)
    with encoding_settings(plan.settings.device, plan.settings.num_threads):  # restored after the run
        return run_local(plan, all_chunks(sources))


def featurize_texts(config: FeaturizeConfig, texts: Sequence[str], store_path: str | Path,
                    role: str = "document") -> dict:
    """Encode the texts (in `role`, deduplicated by row id) missing from the store; a no-op if none are."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}; valid: {list(ROLES)}")
    plan = Plan.make(config, store_path)
    if not len(texts):
        raise ValueError("no texts to featurize (an empty input); give at least one text")
    with encoding_settings(plan.settings.device, plan.settings.num_threads):  # restored after the run
        return run_local(plan, [(role, list(texts))])


def run_local(plan: Plan, chunks: Iterable[list[str]]) -> dict:
    """The local engine: this process encodes every window, a thread commits."""
    t0 = time.perf_counter()
    settings = plan.settings
    counts = {"n_input_texts": 0, "n_encoded": 0, "n_truncated": 0, "real_tokens": 0,
              "padded_tokens": 0, "n_batches": 0, "n_windows": 0}
    committer = encoder = bar = None
    t_encode, next_row = 0.0, 0
    try:
        for prompt, new_ids, new_texts in new_windows(plan, chunks, counts):
            if committer is None:  # the first new texts: the store is locked now
                encoder, choice = open_encoder(settings, sum(map(len, new_texts)))
                plan.writer.provenance = {"backend": choice.backend}
                counts.update(backend=choice.backend, backend_choice=choice.why)
                committer = Committer(plan.writer, settings.commit_seconds, settings.shard_rows)
                next_row = plan.writer.n_texts
                bar = _token_bar()
            t = time.perf_counter()
            _encode_window(settings, encoder, committer, bar, counts,
                           base=next_row, new_ids=new_ids, new_texts=new_texts, prompt=prompt)
            next_row += len(new_ids)
            t_encode += time.perf_counter() - t
        if committer is not None:
            committer.finish()  # the last segment (raises the writer's error)
            plan.save_config()
    except BaseException:
        if committer is not None:  # commit what was finished (unless the writer failed), then re-raise
            committer.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
        if plan.writer is not None:  # the store's lock is released on every path (a notebook goes on)
            plan.writer.close()
    if committer is not None:
        _finish_local(plan, committer, encoder, counts, t_encode)
    return plan.summary(counts, t0)


def _token_bar():
    # in tokens: texts vary in length by 100x (a sentence vs a 256-token abstract), tokens are the work
    return progress_bar(total=0, unit="tok", unit_scale=True, desc="featurize", smoothing=0.1,
                dynamic_ncols=True)


def _finish_local(plan: Plan, committer: Committer, encoder, counts: dict, t_encode: float) -> None:
    """The engine's counts (the last segment is committed, the store released)."""
    settings = plan.settings
    if counts["n_truncated"]:
        progress_write(f"featurize: {counts['n_truncated']} of {counts['n_encoded']} texts were "
                   f"truncated at {encoder.max_length} tokens (column `truncated` in texts/)")
    counts.update(precision=settings.precision, device=settings.device,
                  max_length=encoder.max_length, encode_seconds=round(t_encode, 3),
                  texts_per_s=round(counts["n_encoded"] / max(t_encode, 1e-9), 1),
                  tokens_per_s=round(counts["real_tokens"] / max(t_encode, 1e-9), 1),
                  **_speed_parts(counts, t_encode), **encoder.path.summary(),
                  commit_seconds_total=round(committer.seconds, 3), n_commits=committer.n_commits)
    note = bf16_note(settings.precision, settings.device)  # fp32 on a CPU with native bf16: what bf16 would gain
    if note:
        counts["bf16"] = note


def _speed_parts(counts: dict, t_encode: float) -> dict:
    """Tokenizer vs encoder: each one's real tokens/s (tokenising is part of encode_seconds; the encoder's
    share is the rest), so a summary shows which one bounds the run."""
    tokenize_s = counts.pop("tokenize_seconds", 0.0)
    encoder_s = max(t_encode - tokenize_s, 1e-9)
    return {"tokenize_seconds": round(tokenize_s, 3), "encoder_seconds": round(encoder_s, 3),
            "tokenize_tokens_per_s": round(counts["real_tokens"] / max(tokenize_s, 1e-9), 1),
            "encoder_tokens_per_s": round(counts["real_tokens"] / encoder_s, 1)}


def _encode_window(settings: ResolvedSettings, encoder, committer: Committer, bar,
                   counts: dict, base: int, new_ids: list[str], new_texts: list[str], prompt: str = "") -> None:
    """Encode one window's new texts under `prompt`; rows base, base+1, ... in plan order go to the committer."""
    done = 0
    for idx, feats, tok, batch in encode_in_plan_order(settings, encoder, new_ids, new_texts, prompt):
        if done == 0:  # the window is tokenised: its tokens join the bar's total
            bar.total += int(tok.n_tokens.sum())
            bar.refresh()
        rows = pl.DataFrame({
            "text_id": [new_ids[i] for i in idx], "text": [new_texts[i] for i in idx],
            "row": np.arange(base + done, base + done + len(idx), dtype=np.int64),
            "n_tokens": tok.n_tokens[idx], "truncated": tok.truncated[idx]})
        done += len(idx)
        committer.put((feats, rows))
        counts["real_tokens"] += batch.n_real_tokens
        counts["padded_tokens"] += batch.n_slots
        counts["n_batches"] += 1
        bar.update(batch.n_real_tokens)
        bar.set_postfix(texts=f"{counts['n_encoded'] + done:,}")
    counts["n_encoded"] += len(new_ids)
    counts["n_truncated"] += int(tok.truncated.sum())
    counts["tokenize_seconds"] = counts.get("tokenize_seconds", 0.0) + tok.seconds
