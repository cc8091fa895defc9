"""headstore: featurize texts once with a frozen encoder, train many small energy heads on the features.

The repository's top-level folders are this package's sub-packages (``headstore.data`` <- ``data/``,
``headstore.featurize`` <- ``featurize/``, ``headstore.heads`` <- ``heads/``, ``headstore.cli`` <-
``cli.py``); see ``pyproject.toml``.

Importing headstore changes nothing in the host process (its environment, torch's threads, matplotlib's
backend): the command line makes its process-wide settings where it starts (headstore.cli).
"""

__version__ = "0.2.0"

# The public API, imported on first use so that `import headstore.cli` stays cheap (and the command line's
# environment, set at its import, precedes torch's): headstore.Store, headstore.Head, headstore.Pipeline.
_API = {
    "Store": "headstore.featurize.store.api",
    "Head": "headstore.heads.artefacts.head",
    "Pipeline": "headstore.heads.apply.pipeline",
    "distill": "headstore.heads.experiments.distill.run",  # a teacher (head, ensemble, GRID#ensemble=K) into one head
}
__all__ = [*_API, "__version__"]


def __getattr__(name: str):
    if name in _API:
        import importlib

        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'headstore' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))
