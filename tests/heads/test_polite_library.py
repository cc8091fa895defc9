"""A library that leaves its host process as it found it: the public API (featurize, train a head, Store.open,
Head.load, Pipeline.encode) changes no environment variable, no torch thread count, no matplotlib backend and
no library's progress-bar switch; the command line makes its own process-wide settings where it starts."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

# run in a fresh process (nothing imported yet), as a notebook would: state before, the API, state after
SCRIPT = """
import json, os, sys
sys.path.insert(0, {tests!r})
import matplotlib
matplotlib.use("svg")  # the host's choice (a notebook's inline backend, say)
import torch
torch.set_num_threads(1)  # the host's choice, fewer than the cores featurize would take
import transformers.utils.logging as tlog
import polars, torch._dynamo  # their own settings at import (_RJEM_MALLOC_CONF, TORCHINDUCTOR_CACHE_DIR): not ours

def state():
    return {{"environ": dict(os.environ), "threads": torch.get_num_threads(),
             "backend": matplotlib.get_backend(), "transformers_bars": tlog.is_progress_bar_enabled()}}

before = state()
import headstore
from heads.api_world import World  # featurize a tiny BEIR folder and train a head (its curve.png plotted)
world = World(__import__("pathlib").Path({root!r}))
store, head = headstore.Store.open(world.store), headstore.Head.load(world.head)
pipe = headstore.Pipeline.from_head(head)
z = pipe.encode(store.texts["text"].to_list()[:5])
assert z.shape[0] == 5 and (world.head / "curve.png").is_file()
print(json.dumps({{"before": before, "after": state()}}))
"""


def test_the_public_api_leaves_the_process_as_it_found_it(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE", "_RJEM_MALLOC_CONF", "TOKENIZERS_PARALLELISM")}
    env["HEADSTORE_PROGRESS"] = "lines"  # the mode in which library bars are quietened (a log, a notebook)
    code = SCRIPT.format(tests=str(TESTS), root=str(tmp_path / "world"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    before, after = seen["before"], seen["after"]
    assert before["threads"] == 1 and before["backend"] == "svg" and before["transformers_bars"] is True
    assert after["threads"] == before["threads"]
    assert after["backend"] == before["backend"]
    assert after["transformers_bars"] is True
    changed = {k for k in set(before["environ"]) | set(after["environ"])
               if before["environ"].get(k) != after["environ"].get(k)}
    assert changed == set(), changed


def test_the_command_line_makes_its_settings_where_it_starts():
    """`cli` (headstore.cli) sets OMP_WAIT_POLICY, THP_MEM_ALLOC_ENABLE and _RJEM_MALLOC_CONF before torch or
    polars loads (their measured speed and memory wins), keeping a value the user set; `import headstore`
    sets none."""
    code = ("import json, os, sys, headstore; plain = {k: os.environ.get(k) for k in KEYS}; import headstore.cli; "
            "print(json.dumps([plain, {k: os.environ.get(k) for k in KEYS}, 'torch' in sys.modules]))")
    keys = ["OMP_WAIT_POLICY", "THP_MEM_ALLOC_ENABLE", "_RJEM_MALLOC_CONF"]
    env = {k: v for k, v in os.environ.items() if k not in keys}
    env["THP_MEM_ALLOC_ENABLE"] = "0"  # the user's own value
    out = subprocess.run([sys.executable, "-c", f"KEYS = {keys!r}; {code}"], env=env, capture_output=True,
                         text=True, check=True, timeout=120).stdout
    plain, cli, torch_loaded = json.loads(out)
    assert plain == {"OMP_WAIT_POLICY": None, "THP_MEM_ALLOC_ENABLE": "0", "_RJEM_MALLOC_CONF": None}
    # polars puts its own defaults before ours at its import (jemalloc: the last setting of an option wins)
    assert cli.pop("_RJEM_MALLOC_CONF").endswith("dirty_decay_ms:0,muzzy_decay_ms:0")
    assert cli == {"OMP_WAIT_POLICY": "PASSIVE", "THP_MEM_ALLOC_ENABLE": "0"}
    assert not torch_loaded  # so the settings precede torch's OpenMP runtime


@pytest.mark.parametrize("argv, policy", [(["cli", "grid", "--help"], None), (["cli", "--debug", "train-head"], None),
                                          (["cli", "featurize", "--help"], "PASSIVE"), (["cli"], "PASSIVE")])
def test_the_head_training_commands_keep_openmps_spinning_wait(argv, policy):
    """OMP_WAIT_POLICY=PASSIVE (the encoder's win on a busy CPU) is left unset for grid and train-head, whose many
    small parallel regions each pay a sleeping thread's wake-up (cli.SPINNING_COMMANDS)."""
    code = f"import os, sys; sys.argv = {argv!r}; import headstore.cli; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         timeout=120).stdout.strip()
    assert out == str(policy)


# pages faulted in when a process touches 64 MB that it has just freed and allocated again (glibc's malloc)
REUSE_PROBE = """
import ctypes, resource
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
size = 64 << 20
def touched():
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    return block
libc.free(touched())
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touched()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults_on_reuse(argv: list[str], **env_set: str) -> int:
    code = f"import sys; sys.argv = {argv!r}; import headstore.cli\n{REUSE_PROBE}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"} | env_set
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                              timeout=120).stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                    reason="glibc's malloc only")
def test_the_grid_command_keeps_the_memory_it_frees():
    """`cli grid` has glibc's malloc keep freed blocks for reuse (headstore.data.process.keep_freed_memory): 64 MB
    freed and allocated again faults no fresh pages in, where the other commands (and a user who set malloc's own
    environment) get glibc's default, a fresh mapping faulted page by page."""
    default = _faults_on_reuse(["cli", "featurize", "--help"])
    if default < 1000:  # the kernel backed the block with huge pages: the probe cannot tell the two apart
        pytest.skip(f"only {default} faults for 64 MB: transparent huge pages")
    assert _faults_on_reuse(["cli", "grid", "--help"]) < default / 20
    assert _faults_on_reuse(["cli", "--debug", "grid"]) < default / 20
    assert _faults_on_reuse(["cli", "train-head", "--help"]) > default / 2
    assert _faults_on_reuse(["cli", "grid"], MALLOC_ARENA_MAX="2") > default / 2  # the user's malloc settings win


EXIT_PROBE = """
import atexit, gc, sys
registered = []
real = atexit.register
atexit.register = lambda f, *a, **k: (registered.append(f), real(f, *a, **k))[1]
sys.argv = ["cli", "--help"]
import headstore.cli
at_import = gc.freeze in registered
try:
    headstore.cli.run()
except SystemExit:
    pass
print(at_import, gc.freeze in registered)
"""


def test_the_program_skips_the_last_collection_and_an_importer_keeps_it():
    """The `cli` program (its entry point, `python -m headstore.cli`) freezes its objects out of the garbage collector
    at exit (the shutdown's last collection walks them all); a process that imports headstore.cli keeps its exit."""
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="console_scripts") if e.name == "cli"]
    assert entry.value == "headstore.cli:run"
    out = subprocess.run([sys.executable, "-c", EXIT_PROBE], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split()[-2:] == ["False", "True"], out.stdout
