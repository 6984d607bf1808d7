"""Running programs side by side and measuring XLA health."""
