"""The scoring layer: energies (energy), metrics (ir_metrics, metrics, bootstrap) and the losses (losses/)."""
