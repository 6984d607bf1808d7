"""Rules for porting PyTorch GPU code to PyTorch/XLA (torch_xla 2.9 API)."""
