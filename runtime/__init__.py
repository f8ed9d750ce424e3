"""The VM runtime copied into every package; it imports nothing from the compiler (next issues)."""
