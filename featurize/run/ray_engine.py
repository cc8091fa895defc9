"""`cli featurize --engine ray`: encoding spread over a pool of Ray actors, one store writer.

The driver reads and deduplicates the input exactly as the local engine does (windows.py: windows,
ids) and stages the new texts as segment files of `segment_texts` texts in `S/.ray-staging/` (inside
the store, so on a cluster it is on the store's shared filesystem). A Ray dataset of the segments
(`from_items`: number and file) goes through `map_batches` with `SegmentEncoder`, an actor class
that reads a segment's file and holds the encoder
(one actor per GPU with `--gpus-per-worker 1`, or CPU actors), in one fixed-size
`ActorPoolStrategy` pool for the whole run. The driver, the one writer holding the store's lock, commits each segment
as soon as all its rows are back: features, one texts part, the manifest. A killed actor is
restarted by Ray and its segment retried; a killed job leaves only whole committed segments, and the
rerun skips their texts (they are in the store) and encodes the rest. Features equal the local
engine's up to the float rounding of other batch shapes (fp32: < 1e-6); the store does not record
which engine wrote a segment (the summary and the log do).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import torch

from headstore.data.progress import progress_bar
from headstore.data.errors import SystemFailure
from headstore.data.files import writing
from headstore.featurize.encoder.config import FeaturizeConfig
from headstore.featurize.encoder.resolved import ResolvedSettings
from headstore.featurize.run.ray_cluster import connect, ray_module
from headstore.featurize.run.plan import Plan
from headstore.featurize.run.windows import encode_in_plan_order, new_windows, open_encoder
from headstore.featurize.run.source import all_chunks, open_sources
from headstore.featurize.store.layout import array_names
from headstore.featurize.store.writer import StoreWriter

# a segment is retried on a new actor this many times after the actor encoding it died (an OOM kill, a lost
# node); Ray Data alone restarts actors and retries without limit (its only knob, ray_remote_args, is deprecated),
# so a segment that kills every actor it reaches would be retried forever: SegmentEncoder counts the attempts
ACTOR_RESTARTS = 3
ATTEMPTS_SUFFIX = ".attempts"  # beside a staged segment: how many actors began encoding it
SEGMENT_DIED = "actors died on a segment"
SEGMENT_TEXTS = 16384  # texts per segment: one actor call, one commit, one texts part
STAGING = ".ray-staging"  # in the store: the new texts as segment files Ray Data reads (shared FS)


class SegmentEncoder:
    """Ray actor: loads the encoder once, then encodes one segment per call (batch_size=1)."""

    def __init__(self, settings: ResolvedSettings, crash_at: str | None = None, crash_marker: str | None = None,
                 max_attempts: int = ACTOR_RESTARTS + 1):
        self.settings = settings  # the driver's, resolved once; num_threads: this actor's
        if settings.device == "cpu":
            torch.set_num_threads(settings.num_threads)
        # as the local engine opens it (auto: a runtime only where its export is cached), with this actor's threads
        self.encoder, _ = open_encoder(settings)
        self.names = list(array_names(settings.layers))
        self.crash_at, self.crash_marker, self.calls = crash_at, crash_marker, 0
        self.max_attempts = max_attempts

    def __call__(self, batch: dict) -> dict:
        """One staged segment (batch_size=1: its number and file) -> its rows, encoded, in plan order."""
        self._count_attempt(Path(str(batch["path"][0])), int(batch["segment"][0]))
        self._maybe_crash()
        frame = pl.read_parquet(str(batch["path"][0]))
        ids, texts, prompts = frame["text_id"].to_list(), frame["text"].to_list(), frame["prompt"].to_list()
        segment = np.full(len(ids), int(batch["segment"][0]), dtype=np.int64)
        out = {k: [] for k in ("index", "n_tokens", "truncated", *self.names)}
        for idx, feats, tok, _ in encode_in_plan_order(self.settings, self.encoder, ids, texts, prompts):
            out["index"].append(idx)
            out["n_tokens"].append(tok.n_tokens[idx])
            out["truncated"].append(tok.truncated[idx])
            for name in self.names:
                out[name].append(feats[name])
        index = np.concatenate(out["index"])
        result = {"segment": segment[index],
                  "text_id": np.asarray(ids, dtype=object)[index],
                  "text": np.asarray(texts, dtype=object)[index],
                  "n_tokens": np.concatenate(out["n_tokens"]),
                  "truncated": np.concatenate(out["truncated"])}
        result.update({name: np.concatenate(out[name]) for name in self.names})  # (B, D)
        return result

    def _count_attempt(self, path: Path, segment: int) -> None:
        """Record that an actor begins encoding this segment (a file beside it, on the store's filesystem);
        past max_attempts the actors before died on it: an error ends the run instead of another retry."""
        counter = path.with_name(path.name + ATTEMPTS_SUFFIX)
        attempt = (int(counter.read_text() or 0) if counter.is_file() else 0) + 1
        counter.write_text(str(attempt))
        if attempt > self.max_attempts:
            raise RuntimeError(f"{SEGMENT_DIED}: segment {segment} ({path.name}) killed the {attempt - 1} actors "
                               "that began encoding it")

    def _maybe_crash(self) -> None:
        """Test hook: HEADSTORE_CRASH_AT='actor_segment:k' kills this actor at its k-th call, once
        per marker file (Ray restarts the actor and retries the segment); 'actor_segment_always:k' at
        every call from the k-th on (a segment that kills every actor: the restarts run out)."""
        self.calls += 1
        if not self.crash_at:
            return
        point, _, count = self.crash_at.partition(":")
        if point == "actor_segment_always" and self.calls >= int(count or 1):
            os.kill(os.getpid(), signal.SIGKILL)
        if not self.crash_marker:
            return
        if point == "actor_segment" and self.calls >= int(count or 1):
            try:
                fd = os.open(self.crash_marker, os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                return
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)


def featurize_ray(config: FeaturizeConfig, data_paths: Sequence[str | Path], store_path: str | Path,
                  formats: Sequence[str | None] | None = None, *, address: str | None = None,
                  workers: int = 2, gpus_per_worker: float = 0.0, cpus_per_worker: float = 1.0,
                  segment_texts: int = SEGMENT_TEXTS, unlabeled: Sequence[str | Path] = ()) -> dict:
    """The ray engine; returns the same summary as `featurize` (plus engine, workers)."""
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if gpus_per_worker < 0:
        raise ValueError(f"--gpus-per-worker must be >= 0, got {gpus_per_worker}")
    device = "cuda" if gpus_per_worker > 0 else "cpu"
    if config.device == "cuda" and device == "cpu":
        raise ValueError("--device cuda with the ray engine needs --gpus-per-worker 1 (or more)")
    plan = Plan.make(config, store_path, device=device)
    sources = open_sources(data_paths, formats, unlabeled)
    return run_ray(plan, all_chunks(sources), address=address, workers=workers,
                   gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker,
                   segment_texts=segment_texts)


def featurize_texts_ray(config: FeaturizeConfig, texts: Sequence[str], store_path: str | Path,
                        **options) -> dict:
    device = "cuda" if options.get("gpus_per_worker", 0) > 0 else "cpu"
    plan = Plan.make(config, store_path, device=device)
    if not len(texts):
        raise ValueError("no texts to featurize (an empty input); give at least one text")
    return run_ray(plan, [("document", list(texts))], **options)


class WorkersFailed(SystemFailure):
    """The actor pool gave up on a segment (its actors died more than ACTOR_RESTARTS times)."""


def run_ray(plan: Plan, chunks, *, address: str | None = None, workers: int = 2,
            gpus_per_worker: float = 0.0, cpus_per_worker: float = 1.0,
            segment_texts: int = SEGMENT_TEXTS) -> dict:
    """Stage the new texts as segments, encode them on the actor pool, commit each when complete."""
    ray = ray_module()
    t0 = time.perf_counter()
    _connect(ray, address)
    counts = {"n_input_texts": 0, "n_encoded": 0, "n_truncated": 0, "real_tokens": 0,
              "n_windows": 0, "n_segments": 0}
    staging = plan.store_path / STAGING
    commit_seconds = 0.0
    try:
        sizes = _stage_segments(plan, chunks, counts, staging, segment_texts)
        if sizes:
            blocks = _encoded_blocks(ray, plan, staging, sizes, workers=workers,
                                     gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker)
            try:
                commit_seconds = _commit_segments(plan.writer, blocks, sizes, counts,
                                                  list(array_names(plan.settings.layers)))
            except ray.exceptions.RayError as err:  # an actor error (Ray's traceback is in its logs)
                raise WorkersFailed(
                    f"--engine ray: the encoder actors failed ({_actor_error(err)[:300]}; a segment is retried "
                    f"{ACTOR_RESTARTS} times at most); the {counts['n_segments']} segments committed are kept: "
                    "run the same command again, or with --engine local") from None
        if plan.writer is not None:
            plan.save_config()
    finally:
        if plan.writer is not None:
            shutil.rmtree(staging, ignore_errors=True)
            plan.writer.close()
    encode_seconds = time.perf_counter() - t0
    counts.update(engine="ray", workers=workers, gpus_per_worker=gpus_per_worker,
                  device=plan.settings.device, precision=plan.settings.precision,
                  encode_seconds=round(encode_seconds, 3),
                  texts_per_s=round(counts["n_encoded"] / max(encode_seconds, 1e-9), 1),
                  commit_seconds_total=round(commit_seconds, 3), n_commits=counts["n_segments"])
    return plan.summary(counts, t0)


def _actor_error(err: Exception) -> str:
    """The line of a Ray error that says what failed: SEGMENT_DIED's, else the actor's own exception
    ("AttributeError: ..." in the traceback Ray forwards), else its first line."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(err).splitlines()]
    lines = [line for line in lines if line]
    raised = [line for line in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt): ", line)
              and not line.startswith("ray.")]
    return next((line for line in lines if SEGMENT_DIED in line),
                raised[0] if raised else lines[0] if lines else type(err).__name__)


def _connect(ray, address: str | None) -> None:
    """Start or join Ray (featurize.run.ray_cluster.connect); Ray Data's progress bars off (the driver has its own)."""
    from ray.data import DataContext  # here: Ray is optional

    connect(ray, address)
    DataContext.get_current().enable_progress_bars = False


def _segment_file(staging: Path, segment: int) -> Path:
    return staging / f"segment-{segment:06d}.parquet"


def _stage_segments(plan: Plan, chunks, counts: dict, staging: Path,
                    segment_texts: int) -> dict[int, int]:
    """1. The driver streams the input and stages the new texts as segment files of up to
    segment_texts texts each; returns segment number -> its number of texts."""
    sizes: dict[int, int] = {}
    for i, (prompt, new_ids, new_texts) in enumerate(new_windows(plan, chunks, counts)):
        if i == 0:  # the store was just locked; the lock covers the staging folder too
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
        for start in range(0, len(new_ids), segment_texts):
            segment = len(sizes)
            ids = new_ids[start:start + segment_texts]
            sizes[segment] = len(ids)
            with writing(_segment_file(staging, segment)):  # a full disk: one line naming the file
                pl.DataFrame({"text_id": ids, "text": new_texts[start:start + segment_texts],
                              "prompt": [prompt] * len(ids)}).write_parquet(_segment_file(staging, segment))
    return sizes


def _encoded_blocks(ray, plan: Plan, staging: Path, sizes: dict[int, int], *, workers: int,
                    gpus_per_worker: float, cpus_per_worker: float):
    """2. Ray Data reads the segments and the actor pool encodes them: blocks of encoded rows."""
    from ray.data import ActorPoolStrategy  # here: Ray is optional

    actor_args = {"settings": replace(plan.settings, num_threads=int(max(1, cpus_per_worker))),  # an actor's threads
                  "crash_at": os.environ.get("HEADSTORE_CRASH_AT"),
                  "crash_marker": os.environ.get("HEADSTORE_CRASH_MARKER"), "max_attempts": ACTOR_RESTARTS + 1}
    items = [{"segment": k, "path": str(_segment_file(staging, k))} for k in sorted(sizes)]
    dataset = ray.data.from_items(items, override_num_blocks=len(items))
    encoded = dataset.map_batches(
        SegmentEncoder, fn_constructor_kwargs=actor_args, batch_size=1,
        batch_format="numpy", compute=ActorPoolStrategy(size=workers),
        num_gpus=gpus_per_worker, num_cpus=cpus_per_worker)
    return encoded.iter_batches(batch_size=None, batch_format="numpy")


def _commit_segments(writer: StoreWriter, blocks, sizes: dict[int, int], counts: dict,
                     names: list[str]) -> float:
    """3. The driver commits each segment as soon as all its rows are back; seconds committing."""
    bar = progress_bar(total=sum(sizes.values()), unit="text", desc="featurize (ray)", dynamic_ncols=True)
    pending: dict[int, list[dict]] = {}
    seconds = 0.0
    try:
        for block in blocks:
            for segment in np.unique(block["segment"]).tolist():
                take = block["segment"] == segment
                pending.setdefault(segment, []).append({k: v[take] for k, v in block.items()})
                if sum(len(p["segment"]) for p in pending[segment]) == sizes[segment]:
                    t = time.perf_counter()
                    _commit(writer, pending.pop(segment), names, counts)
                    seconds += time.perf_counter() - t
                    bar.update(sizes[segment])
    finally:
        bar.close()
    assert not pending, f"segments never completed: {sorted(pending)}"
    return seconds


def _commit(writer: StoreWriter, pieces: list[dict], names: list[str], counts: dict) -> None:
    """One finished segment -> rows n.. of the store, committed."""
    part = {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}
    start = writer.n_texts
    rows = pl.DataFrame({"text_id": part["text_id"].tolist(), "text": part["text"].tolist(),
                         "row": np.arange(start, start + len(part["text_id"]), dtype=np.int64),
                         "n_tokens": part["n_tokens"].astype(np.int32),
                         "truncated": part["truncated"].astype(bool)})
    writer.append({name: np.asarray(part[name]) for name in names}, rows)
    counts["n_encoded"] += rows.height
    counts["n_truncated"] += int(rows["truncated"].sum())
    counts["real_tokens"] += int(rows["n_tokens"].sum())
    counts["n_segments"] += 1

