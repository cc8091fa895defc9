"""The local engine's writer thread: finished batches committed to the store as segments, at most every
commit_seconds; a failed commit ends the thread and is raised in the producer, which never waits on it forever."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import polars as pl

from headstore.featurize.store.writer import StoreWriter


class Committer:
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
