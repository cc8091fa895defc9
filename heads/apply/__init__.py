"""A trained head applied outside the store: to new text through the encoder (`Pipeline`, `cli search`),
exported (`cli export`), indexed (`cli index`), or trained on together with the encoder (`cli finetune`).

These are the modules that use both the encoder (featurize) and the heads, so they live above both:
featurize never imports heads (layers: data -> featurize -> heads -> heads.experiments -> cli).
"""
