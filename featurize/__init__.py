"""Frozen-encoder featurization and the feature store (encoder-touching code; `tuning/` adapts and
fine-tunes the encoder itself)."""
