"""The frozen encoder: its settings (config), finding and loading it (model, sentence, architectures, adapters),
tokenise-plan-encode (encode) and pooling (pooling), unpadded batches (packed, varlen), the CPU runtimes (backends,
exported) and the CPU's bf16 (hardware)."""
