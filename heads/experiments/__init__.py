"""The experiments layer: many heads at once, a room each. pyproject.toml's contract orders the rooms:

- `heads_cli`: `cli train-head`, `eval`, `grid` and `select-taps`, thin click layers over the rooms below;
- `compare`: frozen + head against tuned encoders (`cli compare`), and `cli forgetting`;
- `distill`: a teacher into one head (`cli distill`);
- `labels`: SetFit beside the label heads (`cli setfit-compare`);
- `taps`: which taps a head should read (`cli select-taps`);
- `grid`: a grid of heads, its leaderboard, summaries, plots, ensembles and soups, which the rooms above reuse.
"""
