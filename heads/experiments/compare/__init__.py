"""The compare room: frozen + head against MLM-adapted, adapters, LoRA and fine-tuned encoders (`cli compare`), and
task A then task B (`cli forgetting`): resumable steps keyed by what made them, tables with paired CIs, cost."""
