"""Frozen-encoder featurization and the feature store.

Importing the package sets OMP_WAIT_POLICY=PASSIVE (unless the environment already sets it) for
the OpenMP runtime torch loads on first import: OpenMP threads that reach a barrier then sleep
instead of spinning. On a CPU shared with other busy processes, spinning waiters keep the one
thread that still has work off its core, and every op of a forward pass stalls for a time slice;
measured on a 2-core machine at load ~4, MiniLM forwards were 1.7-25x faster with PASSIVE (the
smaller the batch, the larger the gain); on the idle machine a tiny batch (8 x 20 tokens) took
~20% longer (24 vs 20 ms, one measurement); larger ones were not measured idle. It only takes
effect when nothing imported torch before (`cli` imports this package first); the numbers
computed are unchanged (the same threads split the same work).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
