"""Rules for porting PyTorch code to JAX: Flax NNX modules, jax.numpy, optax (jax 0.10, flax 0.12)."""

# pages rendered from this target's tables (python -m porter.docs writes them)
GENERATED_DOCS = {"jax-ops.md": "porter.codemods.jax._ops_table:render_markdown"}
