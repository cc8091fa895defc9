"""The grid room: every combination of a TOML grid trained as stacks (`cli grid`: spec, plan, estimate, inputs,
stacks, the local and Ray runners), then its leaderboard, seen / unseen columns, seed summary, plots, ensembles
and soups."""
