"""porter: move deep-learning training code onto TPUs (torch_xla or JAX), and prove the port."""
__version__ = "0.1.0"
