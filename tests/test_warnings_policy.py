"""pyproject's pytest `filterwarnings`: a DeprecationWarning or FutureWarning attributed to a headstore module
(a deprecated library call the library blames on its caller, or headstore's own) fails the test run; the
same call from elsewhere stays a warning.

Warnings the test run still shows come from third-party code calling third-party code (measured with
`pytest -W default`, transformers 5.24, torch 2.13, Ray 2.60, setfit 1.2, sentence-transformers 6.2); a
library that warns without a stacklevel attributes the warning to itself, so no module filter can blame
headstore for it, which is why headstore's own such calls were fixed in the code instead
(`activation_checkpointing_enable`, heads.apply.finetune).
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# torch.cuda.amp.autocast is deprecated with typing_extensions' @deprecated (FutureWarning), which names the
# caller: a real deprecated library call, made from code whose module is (or is not) headstore's
CALLS = '''
CALL = "import torch\\ntorch.cuda.amp.autocast(enabled=False)"


def run_as(module):
    exec(compile(CALL, module.replace(".", "/") + ".py", "exec"), {"__name__": module})


def test_from_headstore():
    run_as("headstore.heads.apply.finetune")


def test_from_a_user_script():
    run_as("my_notebook")


def test_from_a_module_whose_name_starts_alike():
    run_as("headstore_plugins.extra")


def test_headstore_own_deprecation():
    exec("import warnings\\nwarnings.warn('old option', DeprecationWarning)", {"__name__": "headstore.cli"})
'''


def test_deprecations_from_headstore_modules_fail_the_tests_and_others_do_not(tmp_path):
    (tmp_path / "test_calls.py").write_text(CALLS)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEw",
                          "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    report = out.stdout
    assert "FAILED test_calls.py::test_from_headstore - FutureWarning" in report, report[-3000:]
    assert "FAILED test_calls.py::test_headstore_own_deprecation - DeprecationWarning" in report, report[-3000:]
    assert "2 failed, 2 passed" in report, report[-3000:]
    assert "torch.cuda.amp.autocast(args...)` is deprecated" in report  # the other two: a warning, shown
