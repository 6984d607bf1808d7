"""Rules for MXNet/Gluon sources: Gluon blocks, layers, ops and training loops to plain PyTorch
(mxnet 1.9.1 semantics kept), from which the torch-xla and jax targets continue."""
