"""The artefacts layer: a head and its files on disk (files, head), its curve, a grid's summary, weight soups,
a task's stored features (task_features)."""
