"""Frozen-encoder featurization and the feature store, a folder a layer (pyproject's import contract): `run/` (one
featurize run, local or on Ray) > `store/` (the feature store on disk) > `encoder/` (the frozen encoder: loading,
encode-and-pool); `tuning/` adapts and fine-tunes the encoder itself."""
