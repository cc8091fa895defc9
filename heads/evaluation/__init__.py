"""The evaluation layer: a head scored on a task's splits (evaluate), hard negatives mined in a head's space (mining)."""
