"""The scoring layer: energies (energy), metrics (metrics) and the losses (losses/)."""
