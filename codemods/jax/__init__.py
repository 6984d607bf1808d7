"""Rules for porting PyTorch code to JAX: Flax NNX modules, jax.numpy, optax (jax 0.10, flax 0.12)."""
