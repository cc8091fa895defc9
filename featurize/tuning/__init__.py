"""The encoder itself changed before featurizing: MLM adaptation on the user's unlabeled text (`cli adapt`: adapt,
its probe MLM head, packing, its schedule, checkpoints, when its loss has settled) and the MLM loss on held-out text
(mlm_eval, the forgetting probe)."""
