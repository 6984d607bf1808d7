from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp



class TorchImageUtils(Rule):
    """
    ## What it does
    Hands torchvision's image helpers (`torchvision.utils.save_image`, `make_grid`) a torch
    tensor made from the port's array: `vutils.save_image(fake, path, normalize=True)` ->
    `vutils.save_image(torch.as_tensor(np.asarray(fake)), path, normalize=True)`. A value
    that is already such a conversion, a list or a tuple, is left as it is.

    ## Why
    They are host code a JAX port keeps (writing sample images of a GAN or a VAE every N
    steps), but they check their input: a JAX or NumPy array fails with "TypeError: tensor or
    list of tensors expected, got <class 'numpy.ndarray'>" at the first logging step, after
    the training steps ran.

    ## Fix safety
    Safe: `np.asarray` copies the array to the host (it is also what a torch CPU tensor the
    port kept gives), `torch.as_tensor` wraps it without a copy; the helper sees the values
    the original gave it, on the CPU.
    """

    code = "JX318"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-torch-image-utils"
    target = "jax"
    summary = "torchvision.utils.save_image / make_grid(x) -> (torch.as_tensor(np.asarray(x)), ...)"
    severity = Severity.ERROR
    needs_text = ("save_image", "make_grid")
    examples = [
        Example(
            """
            import jax
            import torch
            import torchvision.utils as vutils

            def log_samples(netG, noise, epoch):
                fake = netG(noise)
                vutils.save_image(jax.lax.stop_gradient(fake), f"fake_{epoch:03d}.png", normalize=True)
                grid = vutils.make_grid(fake, nrow=8)
                return grid
            """,
            """
            import jax
            import torch
            import torchvision.utils as vutils
            import numpy as np

            def log_samples(netG, noise, epoch):
                fake = netG(noise)
                vutils.save_image(torch.as_tensor(np.asarray(jax.lax.stop_gradient(fake))), f"fake_{epoch:03d}.png", normalize=True)
                grid = vutils.make_grid(torch.as_tensor(np.asarray(fake)), nrow=8)
                return grid
            """,
        ),
    ]
    valid = [
        "import torch\nimport numpy as np\nfrom torchvision.utils import save_image\n"
        "save_image(torch.as_tensor(np.asarray(x)), 'a.png')\n",
        "import torch\nfrom torchvision.utils import save_image\nsave_image([a, b], 'a.png')\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in lp.TORCH_IMAGE_UTILS or not lp.imports_torch(self.ctx):
            return
        first = astutil.arg(node, "tensor", 0)
        if first is None or isinstance(first.value, (cst.List, cst.Tuple, cst.ListComp)):
            return
        value = first.value
        if isinstance(value, cst.Call) and self.ctx.qualname(value.func) in ("torch.as_tensor", "torch.from_numpy",
                                                                            "torch.tensor", "torch.stack", "torch.cat"):
            return
        np_ = self.ctx.module_alias("numpy")
        torch = self.ctx.module_alias("torch")
        wrapped = astutil.parse_expression(f"{torch}.as_tensor({np_}.asarray({astutil.code(value)}))")
        name = (self.ctx.qualname(node.func) or "").rsplit(".", 1)[-1]
        self.report(node, f"{name} takes a torch tensor: the port's array is handed over as one (on the host)",
                    Fix((self.replace(value, wrapped),), Safety.SAFE, imports=("numpy", "torch")))
