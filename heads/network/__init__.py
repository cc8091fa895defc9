"""The network layer: the stacked heads (model), their input features (features), candidate negatives (candidates)."""
