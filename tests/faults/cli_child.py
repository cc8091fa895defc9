"""`cli ARGS` in a child process with the fault of $HEADSTORE_FAULT injected (tests/faults/fault_inject.py)."""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from fault_inject import COUNTS_ENV, FAULT_ENV, Fault, injected  # noqa: E402

fault = Fault.parse(os.environ.get(FAULT_ENV, "atomic:count:1"))
with injected(fault):
    from headstore.cli import main

    try:
        main(prog_name="cli")
    finally:
        if os.environ.get(COUNTS_ENV):
            Path(os.environ[COUNTS_ENV]).write_text(json.dumps(fault.calls))
