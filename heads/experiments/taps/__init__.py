"""The taps room: which of a `--taps` store's taps a head should read, chosen on the training pairs alone
(`cli select-taps`)."""
