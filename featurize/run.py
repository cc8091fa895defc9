"""One featurize run, streamed: input windows -> texts not yet stored -> encoder -> committed segments.

The input is read in windows of `window_texts` texts (source.py). In each window the texts whose id
is neither in the store nor earlier in the input are tokenised, planned longest-first (encode.py) and
encoded; a writer thread commits segments as they finish. Memory is one window plus the ids (16
bytes per text, ids.py), whatever the corpus size. Window boundaries depend on the input alone and a
window's plan on its texts alone, so after a crash the rerun skips committed texts, re-plans the
interrupted window's rest exactly as the first run would have, and gives every text the same row and
bit-identical features. The store and the encoder are opened only when a window has new texts: an
up-to-date store (even a read-only one) is never written, and an empty input never creates a store.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import torch

from headstore.data.progress import progress_bar, progress_write
from headstore.data.files import atomic_write_text
from headstore.data.text_id import ROLES
from headstore.featurize.config import FINGERPRINTED_NUMERICS, FeaturizeConfig
from headstore.featurize.encode import (CODE_VERSION, Batch, Tokenized, encode_batch, features_to_host, plan_batches,
                                        prefetch_batches, prompt_length, tokenize)
from headstore.featurize.ids import IdSet, digests, first_occurrences, keys_of_digests, keys_of_hex
from headstore.featurize.hardware import bf16_note, warn_if_emulated_bf16
from headstore.featurize.model import check_options, encoding_settings, load_encoder, model_identity, pick_device
from headstore.featurize.backends import AUTO, Choice, backend_part, check_backend, choose_backend, use_backend
from headstore.featurize.packed import prepare_encoder
from headstore.featurize.pooling import Pooler
from headstore.featurize.sentence import SentenceSpec, resolve_prompts, resolve_spec, sentence_dim
from headstore.featurize.source import all_chunks, open_sources, windows
from headstore.featurize.store import (MANIFEST, FeatureStore, StoreError, array_names, check_fingerprint,
                                       finite_rows, segment_backends, stored_ids)
from headstore.featurize.writer import StoreWriter


def fingerprint_parts(config: FeaturizeConfig, device: str | None = None) -> dict:
    """The fingerprint parts of a run with this config (hashes are cached: cheap to repeat)."""
    identity = model_identity(config.model, config.max_length)
    device = device or pick_device(config.device)
    spec = resolve_spec(config.pooling, identity.model_dir)
    prompts = resolve_prompts(identity.model_dir, config.query_prompt, config.document_prompt, config.prompt_name)
    return {"model_id": identity.model_id, "weights_hash": identity.weights_hash,
            "tokenizer_hash": identity.tokenizer_hash, **spec.parts(),
            "layers": list(config.layers), "max_length": identity.max_length,
            "dtype": config.dtype, "precision": config.resolved_precision(device),
            "code_version": CODE_VERSION,
            **({"prompts": prompts} if any(prompts.values()) else {}),  # absent: stores made before prompts
            **numerics_part(config, device), **backend_part(config.backend, config.resolved_precision(device))}


def numerics_part(config: FeaturizeConfig, device: str) -> dict:
    """{"numerics": ...} for weights held in bf16/fp16, else {} (fp32 and bf16-autocast stores predate the
    part and keep their fingerprint). Packing is not a part: in fp32 it moves features by ~1e-7, as a
    different batch plan does (also not a part); in bf16 a packed and a padded batch differ by bf16's rounding
    in different kernels, as two batch plans' shapes already do, far inside the bf16-vs-fp32 bound (1e-2),
    while bf16-weights and bf16-autocast round different tensors (weights vs each matmul's inputs)."""
    numerics = config.resolved_numerics(device)
    return {"numerics": numerics} if numerics in FINGERPRINTED_NUMERICS else {}


def featurize(config: FeaturizeConfig, data_paths: Sequence[str | Path], store_path: str | Path,
              formats: Sequence[str | None] | None = None, unlabeled: Sequence[str | Path] = ()) -> dict:
    """Encode every text of the datasets (and of the `unlabeled` files, data.unlabeled: documents) that the store
    does not hold yet; returns a summary."""
    plan = Plan.make(config, store_path)  # refuses bad options before anything is read or created
    sources = open_sources(data_paths, formats, unlabeled)
    with encoding_settings(plan.device, config.num_threads):  # restored after the run
        return run_local(plan, all_chunks(sources))


def featurize_texts(config: FeaturizeConfig, texts: Sequence[str], store_path: str | Path,
                    role: str = "document") -> dict:
    """Encode the texts (in `role`, deduplicated by row id) missing from the store; a no-op if none are."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}; valid: {list(ROLES)}")
    plan = Plan.make(config, store_path)
    if not len(texts):
        raise ValueError("no texts to featurize (an empty input); give at least one text")
    with encoding_settings(plan.device, config.num_threads):  # restored after the run
        return run_local(plan, [(role, list(texts))])


@dataclass
class Plan:
    """What a run needs before reading any input: checked options, fingerprint, the stored ids."""

    config: FeaturizeConfig
    store_path: Path
    parts: dict
    dim: int
    device: str
    stored: IdSet  # committed ids when the run began (marks count the ones the input holds)
    n_stored: int  # committed rows when the run began
    added: IdSet = field(default_factory=IdSet)  # ids queued for encoding by this run
    writer: StoreWriter | None = None  # opened by open_writer, at the first new text (never if none)

    @classmethod
    def make(cls, config: FeaturizeConfig, store_path: str | Path, device: str | None = None) -> "Plan":
        store_path = Path(store_path)
        device = device or pick_device(config.device)
        _, hidden = check_options(config.model, config.max_length, config.layers)
        parts = fingerprint_parts(config, device)
        dim = sentence_dim(SentenceSpec.from_parts(parts), hidden, config.layers)
        check_backend(config.backend, device, parts["precision"], config.packing == "on")
        warn_if_emulated_bf16(parts["precision"], device)  # one line on stderr where bf16 is emulated
        if store_path.exists() and (not store_path.is_dir() or (
                any(store_path.iterdir()) and not (store_path / MANIFEST).is_file())):
            raise StoreError(f"{store_path}: exists and is not a feature store (no {MANIFEST}); "
                             "give a new or an existing store path")
        stored, n_stored = IdSet(), 0
        if (store_path / MANIFEST).is_file():
            store = FeatureStore.open(store_path)
            check_fingerprint(store_path, store.manifest, parts)
            stored, n_stored = stored_ids(store), store.n_texts
        return cls(config, store_path, parts, dim, device, stored, n_stored)

    def prompt(self, role: str) -> str:
        """The prompt texts of `role` are encoded under ("" for a store without prompts)."""
        return self.parts.get("prompts", {}).get(role, "")

    def new_in_window(self, window: list[str], prompt: str = "") -> tuple[list[str], list[str], np.ndarray]:
        """(hex row ids, texts, keys) of the window's texts (under `prompt`) neither stored nor queued."""
        raw = digests(window, prompt)
        keys = keys_of_digests(raw)
        fresh = ~(self.stored.mark(keys) | self.added.contains(keys))
        idx = np.flatnonzero(fresh)
        idx = idx[first_occurrences(keys[idx])]
        return [raw[i].hex() for i in idx], [window[i] for i in idx], keys[idx]

    def open_writer(self) -> StoreWriter:
        """Lock the store (creating it) as `self.writer`; ids another writer committed meanwhile
        join `added`."""
        config = self.config
        writer = self.writer = StoreWriter.open_or_create(self.store_path, self.parts, dim=self.dim,
                                                          chunk_rows=config.chunk_rows,
                                                          shard_rows=config.shard_rows)
        writer.provenance = {"backend": config.backend}  # the local engine puts auto's choice here (run_local)
        if writer.n_texts != self.n_stored:
            for part in writer.manifest["parts"]:
                if part["start"] >= self.n_stored:
                    frame = pl.read_parquet(self.store_path / part["path"], columns=["text_id"])
                    self.added.add(keys_of_hex(frame["text_id"]))
            self.n_stored = writer.n_texts
        return writer

    def save_config(self) -> None:
        """The settings of the latest run that added rows, beside the store (speed settings may
        differ between runs; the parts that change numbers are in the fingerprint)."""
        atomic_write_text(self.store_path / "config.json", self.config.to_json())

    def summary(self, counts: dict, t0: float) -> dict:
        store = FeatureStore.open(self.store_path) if (self.store_path / MANIFEST).is_file() else None
        n_truncated = int(store.scan_texts(["truncated"]).select(pl.col("truncated").sum())
                          .collect().item() or 0) if store else 0
        return {"store": str(self.store_path), **counts,
                "n_already_stored": self.stored.n_marked(),
                "n_unique": self.stored.n_marked() + counts["n_encoded"],
                "n_texts": store.n_texts if store else 0,
                "fingerprint": store.fingerprint if store else None,
                "rows_by_backend": segment_backends(store.manifest) if store else {},
                "n_truncated_in_store": n_truncated, "seconds": round(time.perf_counter() - t0, 3)}


class _Committer:
    """Writer thread: commits finished batches as one segment at most every commit_seconds.

    Nothing waits on it forever: a commit that fails (a full disk, a vanished folder) stores its error
    and ends the thread; `put` (which waits for room at most WAIT_S at a time) and `finish` then raise
    that error, and `abort` returns as soon as the thread is gone."""

    WAIT_S = 0.1  # how often a producer waiting for room in the inbox looks at the thread again

    def __init__(self, writer: StoreWriter, commit_seconds: float, max_pending_rows: int):
        self.writer = writer
        self.commit_seconds = commit_seconds
        self.max_pending_rows = max_pending_rows
        self.inbox: queue.Queue = queue.Queue(maxsize=64)
        self.error: BaseException | None = None
        self.seconds = 0.0  # spent committing
        self.n_commits = 0
        self.thread = threading.Thread(target=self._run, name="headstore-writer", daemon=True)
        self.thread.start()

    def put(self, item) -> None:
        """Queue a finished batch (None: the end); raises the writer's error once it has failed."""
        while True:
            if self.error is not None:
                raise self.error
            if not self.thread.is_alive():
                raise RuntimeError("the store writer thread has ended")  # a bug: nothing may follow None
            try:
                self.inbox.put(item, timeout=self.WAIT_S)
                return
            except queue.Full:
                continue

    def finish(self) -> None:
        """Commit what is queued and end the thread; raises the writer's error."""
        self.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error

    def abort(self) -> None:
        """After a failure elsewhere: commit what was finished (if the writer still can), end the thread;
        never raises, never waits on a thread that has failed."""
        try:
            self.put(None)
        except BaseException:
            return  # the writer failed (its error is in self.error) or has ended
        self.thread.join()

    def _run(self):
        pending_feats: list[dict[str, np.ndarray]] = []
        pending_rows: list[pl.DataFrame] = []
        last = time.monotonic()
        try:
            while True:
                item = self.inbox.get()
                if item is not None:
                    pending_feats.append(item[0])
                    pending_rows.append(item[1])
                n_pending = sum(r.height for r in pending_rows)
                due = (item is None or time.monotonic() - last >= self.commit_seconds
                       or n_pending >= self.max_pending_rows)
                if due and pending_rows:
                    t = time.perf_counter()
                    feats = {k: np.concatenate([f[k] for f in pending_feats]) for k in pending_feats[0]}
                    self.writer.append(feats, pl.concat(pending_rows))
                    self.seconds += time.perf_counter() - t
                    self.n_commits += 1
                    pending_feats, pending_rows, last = [], [], time.monotonic()
                if item is None:
                    return
        except BaseException as err:  # the thread ends here; put/finish raise it in the producer
            self.error = err


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
    for prompt, window in windows(by_prompt, plan.config.window_texts):
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


def run_local(plan: Plan, chunks: Iterable[list[str]]) -> dict:
    """The local engine: this process encodes every window, a thread commits."""
    t0 = time.perf_counter()
    config = plan.config
    counts = {"n_input_texts": 0, "n_encoded": 0, "n_truncated": 0, "real_tokens": 0,
              "padded_tokens": 0, "n_batches": 0, "n_windows": 0}
    committer = encoder = bar = None
    t_encode, next_row = 0.0, 0
    try:
        for prompt, new_ids, new_texts in new_windows(plan, chunks, counts):
            if committer is None:  # the first new texts: the store is locked now
                encoder, choice = _open_encoder(config, plan.device, sum(map(len, new_texts)))
                plan.writer.provenance = {"backend": choice.backend}
                counts.update(backend=choice.backend, backend_choice=choice.why)
                committer = _Committer(plan.writer, config.commit_seconds, config.shard_rows)
                next_row = plan.writer.n_texts
                bar = _token_bar()
            t = time.perf_counter()
            _encode_window(config, encoder, plan.device, committer, bar, counts,
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


def _finish_local(plan: Plan, committer: _Committer, encoder, counts: dict, t_encode: float) -> None:
    """The engine's counts (the last segment is committed, the store released)."""
    config = plan.config
    if counts["n_truncated"]:
        progress_write(f"featurize: {counts['n_truncated']} of {counts['n_encoded']} texts were "
                   f"truncated at {encoder.max_length} tokens (column `truncated` in texts/)")
    counts.update(precision=config.resolved_precision(plan.device), device=plan.device,
                  max_length=encoder.max_length, encode_seconds=round(t_encode, 3),
                  texts_per_s=round(counts["n_encoded"] / max(t_encode, 1e-9), 1),
                  tokens_per_s=round(counts["real_tokens"] / max(t_encode, 1e-9), 1),
                  **_speed_parts(counts, t_encode), **encoder.path.summary(),
                  commit_seconds_total=round(committer.seconds, 3), n_commits=committer.n_commits)
    note = bf16_note(counts["precision"], plan.device)  # fp32 on a CPU with native bf16: what bf16 would gain
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


def _open_encoder(config: FeaturizeConfig, device: str, n_chars: int | None = None) -> tuple:
    """(the run's encoder, its forward in the backend chosen once for the run; that Choice). auto weighs
    `n_chars` characters of new text against building a missing export (featurize.backends.choose_backend)."""
    encoder = load_encoder(config.model, device, config.max_length)
    path = prepare_encoder(encoder, config, device)
    precision = config.resolved_precision(device)
    choice = (choose_backend(encoder, config.layers, precision, path.packing, config.num_threads, config.export_cache,
                             n_chars) if config.backend == AUTO else Choice(config.backend, "given (--backend)"))
    return use_backend(encoder, choice.backend, config.layers, precision,  # torch: itself
                       config.num_threads, config.export_cache), choice


def _load(config: FeaturizeConfig, device: str):
    """The encoder as a run opens it (auto: a runtime only where its export is cached)."""
    return _open_encoder(config, device)[0]


def encode_in_plan_order(config: FeaturizeConfig, encoder, device: str, ids: list[str], texts: list[str],
                         prompts: str | list[str] = "") -> Iterator[tuple[np.ndarray, dict, Tokenized, Batch]]:
    """Tokenise prompt + text (as sentence-transformers does) and plan the texts (longest first), encode
    batch by batch: yields (indices into texts, {array name: (B, D) features in the store dtype}, the
    tokenisation, the batch). `prompts`: one prompt for every text, or one per text."""
    names = list(array_names(config.layers))
    np_dtype = np.dtype(config.dtype)
    path = encoder.path or prepare_encoder(encoder, config, device)  # numerics, packing: once per encoder
    prompts = [prompts] * len(texts) if isinstance(prompts, str) else list(prompts)
    tok = tokenize(encoder.tokenizer, [p + t for p, t in zip(prompts, texts)], encoder.max_length,
                   threads=config.resolved_tokenize_threads(device))
    prompt_lengths = torch.as_tensor([prompt_length(encoder.tokenizer, p) for p in prompts], dtype=torch.int64)
    order, batches = plan_batches(tok.n_tokens, ids, config.batch_tokens, config.max_batch_size,
                                  batch_overhead_tokens=config.resolved_batch_overhead(device),
                                  attention_width=6 * encoder.model.config.hidden_size, packed=path.packing)
    pad_id = encoder.tokenizer.pad_token_id or 0
    pooler = Pooler.of(resolve_spec(config.pooling, encoder.identity.model_dir), encoder.identity.model_dir)
    # CPU: collate inline (the cores are busy with the forward); GPU: in a background thread
    depth = 4 if device == "cuda" else 0

    def pooled_batches():
        for batch in prefetch_batches(tok, order, batches, pad_id, pin=device == "cuda", depth=depth,
                                      packed=path.packing):
            lengths = prompt_lengths[order[batch.start: batch.start + batch.n_texts]]  # (B,)
            yield batch, encode_batch(encoder, batch, pooler, config.layers, path.autocast, lengths)  # [(B, D)]

    for batch, host in features_to_host(pooled_batches(), cuda=device == "cuda"):
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


def _encode_window(config: FeaturizeConfig, encoder, device: str, committer: _Committer, bar,
                   counts: dict, base: int, new_ids: list[str], new_texts: list[str], prompt: str = "") -> None:
    """Encode one window's new texts under `prompt`; rows base, base+1, ... in plan order go to the committer."""
    done = 0
    for idx, feats, tok, batch in encode_in_plan_order(config, encoder, device, new_ids, new_texts, prompt):
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
