"""A port whose model cannot even be built: the side must fail with a clear cause."""
import torch
import torch_xla


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        raise RuntimeError("layer widths were lost in the port")
