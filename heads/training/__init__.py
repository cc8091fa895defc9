"""The training layer: train-head and eval (run), one stack's training loop (train) and its parts (batches, optim,
tracker, selection, strength, anchor), a stack's settings resolved once at the door (resolved), the fused
optimiser (stacked_adamw)."""
