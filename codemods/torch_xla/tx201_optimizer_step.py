import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _training as tr


class OptimizerStep(Rule):
    """
    ## What it does
    Rewrites `optimizer.step()` to `xm.optimizer_step(optimizer)` (and
    `optimizer.step(closure)` to `xm.optimizer_step(optimizer, optimizer_args={"closure": closure})`).

    An object counts as an optimizer when the file assigns it from a `torch.optim`
    constructor, resolved through the imports (`optim.SGD(...)`, `from torch.optim import
    Adam`, `torch.optim.AdamW(...)`, a class of the file deriving from a `torch.optim`
    optimizer, a list of those for `optimizers[i]`), anywhere in the file: `self.optimizer`
    assigned in `__init__` and stepped in `train_step` is resolved too. Only a function
    parameter that nothing in the file binds gets the name heuristic (`optimizer`, `opt`,
    `optimizer_g`...). Schedulers (`torch.optim.lr_scheduler.*`, `swa_utils`) and GradScalers
    never match: `scaler.step(optimizer)` belongs to the mixed-precision rules, which unwind
    it into `xm.optimizer_step`. A `.step()` on something named like an optimizer but built
    by code porter cannot see (`self.opt = build_optimizer(cfg)`) is reported without a fix.

    In a file that wraps its model in `torch.nn.parallel.DistributedDataParallel`, the
    `optimizer.step()` is kept and reported (information): DDP's backward pass already
    all-reduces the gradients, and torch_xla's DDP guide steps with a plain
    `optimizer.step()` followed by `torch_xla.sync()` (or a `pl.MpDeviceLoader`). A `.step()`
    porter cannot resolve is then not reported at all (never advised to become
    `xm.optimizer_step`).

    ## Why
    On XLA the optimizer step must be part of the traced step graph and, when several
    replicas train together, gradients must be all-reduced before the update.
    `xm.optimizer_step` does both (and is a plain `optimizer.step()` on one device).

    ## Fix safety
    Safe: on a single device it calls `optimizer.step()` (with the same closure); with
    several replicas it adds the gradient all-reduce the XLA data-parallel set-up needs.
    """

    code = "TX201"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-optimizer-step"
    target = "torch-xla"
    summary = "optimizer.step() -> xm.optimizer_step(optimizer)"
    severity = Severity.WARNING
    needs_text = (".step(",)
    examples = [
        Example(
            """
            import torch

            def train(model, optimizer, loss):
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """,
            """
            import torch
            import torch_xla.core.xla_model as xm

            def train(model, optimizer, loss):
                optimizer.zero_grad()
                loss.backward()
                xm.optimizer_step(optimizer)
            """,
            title="a parameter named like an optimizer",
        ),
        Example(
            """
            import torch.optim as optim
            from torch.optim import Adam
            from torch.optim.lr_scheduler import StepLR

            class Trainer:
                def __init__(self, model):
                    self.net_opt = Adam(model.parameters())
                    self.sched = StepLR(self.net_opt, 1)

                def fit(self, model, batches):
                    sgd = optim.SGD(model.parameters(), lr=0.1)
                    for x in batches:
                        model(x).sum().backward()
                        sgd.step()
                        self.net_opt.step()
                        self.sched.step()
            """,
            """
            import torch.optim as optim
            from torch.optim import Adam
            from torch.optim.lr_scheduler import StepLR
            import torch_xla.core.xla_model as xm

            class Trainer:
                def __init__(self, model):
                    self.net_opt = Adam(model.parameters())
                    self.sched = StepLR(self.net_opt, 1)

                def fit(self, model, batches):
                    sgd = optim.SGD(model.parameters(), lr=0.1)
                    for x in batches:
                        model(x).sum().backward()
                        xm.optimizer_step(sgd)
                        xm.optimizer_step(self.net_opt)
                        self.sched.step()
            """,
            title="optimizers resolved from torch.optim constructors, scheduler left alone",
        ),
        Example(
            """
            import torch

            lbfgs = torch.optim.LBFGS(params)

            def closure():
                return loss_fn()

            lbfgs.step(closure)
            """,
            """
            import torch
            import torch_xla.core.xla_model as xm

            lbfgs = torch.optim.LBFGS(params)

            def closure():
                return loss_fn()

            xm.optimizer_step(lbfgs, optimizer_args={"closure": closure})
            """,
            title="a closure goes through optimizer_args",
        ),
        Example(
            """
            import torch

            class Trainer:
                def __init__(self, cfg, model):
                    self.opt = build_optimizer(cfg, model)

                def step(self, loss):
                    loss.backward()
                    self.opt.step()
            """,
            None,
            title="built by code porter cannot see: reported only",
        ),
        Example(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(net, gradient_as_bucket_view=True)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
            """,
            None,
            title="DistributedDataParallel reduces the gradients in backward(): optimizer.step() stays (reported)",
        ),
    ]
    valid = [
        "scheduler.step()\n",
        "import torch_xla.core.xla_model as xm\nxm.optimizer_step(opt)\n",
        "import torch\nopt.step(closure)\n",
        # GradScaler: the precision rules own scaler.step(optimizer)
        "import torch\nscaler = torch.cuda.amp.GradScaler()\ndef f(optimizer, loss):\n"
        "    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n",
        # a scheduler, even when named like an optimizer
        "from torch.optim import lr_scheduler\nopt_sched = lr_scheduler.StepLR(o, 1)\nopt_sched.step()\n",
        # an optimizer-looking parameter that the function rebinds to a scheduler
        "import torch\ndef f(optimizer):\n    optimizer = torch.optim.lr_scheduler.OneCycleLR(optimizer, 1.0)\n    optimizer.step()\n",
        # a DDP file: an optimizer porter cannot resolve is not advised to become xm.optimizer_step
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "class Trainer:\n    def __init__(self, model, optimizer):\n        self.model = DDP(model)\n"
        "        self.optimizer = optimizer\n    def _run_batch(self, x):\n"
        "        self.model(x).sum().backward()\n        self.optimizer.step()\n",
        # environments and other objects with a step()
        "import torch\ndef rollout(env, model):\n    env.step(model(obs))\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step"):
            return
        closure = None
        if node.args:
            if len(node.args) != 1 or node.args[0].star:
                return
            a = node.args[0]
            if a.keyword is not None and a.keyword.value != "closure":
                return
            closure = a.value
        receiver = func.value
        how = tr.optimizer_resolution(receiver, self.ctx)
        if how is None:
            return
        if how == "name":
            if tr.wraps_in_ddp(self.ctx):
                return  # DDP reduces the gradients: a plain step is right whatever the object is
            if self._in_training_code():
                self.report(
                    node,
                    "this looks like an optimizer step, but porter cannot see where the object is "
                    "built: if it is a torch.optim optimizer, write xm.optimizer_step(...) so that "
                    "replicas all-reduce their gradients before the update",
                    severity=Severity.INFO,
                )
            return
        if tr.wraps_in_ddp(self.ctx):
            self.report(
                node,
                "the model is wrapped in DistributedDataParallel, whose backward pass already "
                "all-reduces the gradients: keep optimizer.step() (torch_xla's DDP guide does), "
                "xm.optimizer_step would reduce them a second time; the step marker comes from "
                "pl.MpDeviceLoader or torch_xla.sync()",
                severity=Severity.INFO,
            )
            return
        xm = self.ctx.module_alias("torch_xla.core.xla_model")
        args = [cst.Arg(receiver)]
        if closure is not None:
            args.append(
                cst.Arg(
                    cst.Dict([cst.DictElement(cst.SimpleString('"closure"'), closure)]),
                    keyword=cst.Name("optimizer_args"),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                )
            )
        new = cst.parse_expression(f"{xm}.optimizer_step(_)").with_changes(args=args)
        self.report(
            node,
            "optimizer.step() on XLA: use xm.optimizer_step(optimizer)",
            Fix((self.replace(node, new),), imports=("torch_xla.core.xla_model",)),
        )

    def _in_training_code(self) -> bool:
        """The call sits in a function or loop that also runs a backward pass."""
        for anc in reversed(self.ctx.ancestors[:-1]):
            if isinstance(anc, (cst.FunctionDef, cst.For, cst.While)):
                if any(astutil.method_name(c) == "backward" for c in astutil.calls_in(anc.body)):
                    return True
            if isinstance(anc, cst.FunctionDef):
                return False
        return False
