"""Scripts that are not library: the GPU lane, GPU-side checks and long runs (run from the
repository root)."""
