"""One featurize run: what it needs before reading input (plan), its input (source) in windows (windows), the
local engine (local, committer) and the Ray engine (ray_engine, ray_cluster)."""
