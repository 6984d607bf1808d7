from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp
from . import _nnx, _program


class ModelRngs(Rule):
    """
    ## What it does
    Gives every construction of a model class of the file (a class deriving from
    `nn.Module` / `nnx.Module`, or a module-level factory function returning one or taking a
    required keyword-only `rngs`, as the module rules give factories) outside the
    model classes an `rngs=nnx.Rngs(seed)` argument; likewise a model class or factory the
    file imports from another file of its program (`from models import *` through a
    package's star imports, `from model import Net as Classifier`, relative imports: the
    source next to the file is read, as Python would resolve the import from the script's
    folder; `import model as m` then `m.Net(...)`), since that file's port takes `rngs` too.
    A classmethod or staticmethod of a model class that builds the model
    (`GPT.from_pretrained(...)` constructing `cls(config)` or `GPT(config)`), called through
    the class, takes `rngs` once ported and gets it the same way; so does a construction
    given a dict of the script's with `**` (`GPT(**model_args)`), while a function's own
    `**kwargs` passed on are left to carry its callers' `rngs`. The seed is the argument of the
    `torch.manual_seed(seed)` call of the same function (or of the script's top level) made
    before the construction, else 0. `torch.manual_seed` itself stays: torch still drives the
    data pipeline (loader shuffling, samplers, augmentation) and its seed keeps that
    reproducible.

    ## Why
    Flax NNX modules draw their initial parameters (and dropout masks) from an explicit
    `nnx.Rngs` object passed to the constructor (`def __init__(self, ..., *, rngs)`), not
    from a global generator: `torch.manual_seed` no longer seeds the model.

    ## Fix safety
    Safe: the model is built reproducibly from the script's seed. Its initial weights are
    not those of the PyTorch script (different generators); to start from the same weights,
    convert a PyTorch state dict with the port's `load_torch_state_dict`. A loader that
    shuffles with the global torch generator draws its order after the model was built in
    PyTorch, so without a `generator=` of its own the data order differs from the original's.
    """

    code = "JX304"
    name = "jax-model-rngs"
    target = "jax"
    summary = "Net(...) -> Net(..., rngs=nnx.Rngs(seed)) with the seed of torch.manual_seed"
    severity = Severity.ERROR
    needs_text = ("Module", "rngs", "from ", "models")  # "from ": models imported from other files of the program
    examples = [
        Example(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self, hidden):
                    super().__init__()
                    self.fc = nn.Linear(4, hidden)

            def main(args):
                torch.manual_seed(args.seed)
                model = Net(args.hidden)
            """,
            """
            import torch
            import torch.nn as nn
            import flax.nnx as nnx

            class Net(nn.Module):
                def __init__(self, hidden):
                    super().__init__()
                    self.fc = nn.Linear(4, hidden)

            def main(args):
                torch.manual_seed(args.seed)
                model = Net(args.hidden, rngs=nnx.Rngs(args.seed))
            """,
            title="the script's seed",
        ),
        Example(
            """
            import torch.nn as nn

            class ResNet(nn.Module):
                def __init__(self, block, layers, num_classes=1000):
                    super().__init__()

            def resnet18(**kwargs):
                return ResNet(BasicBlock, [2, 2, 2, 2], **kwargs)

            model = resnet18(num_classes=10)
            """,
            """
            import torch.nn as nn
            import flax.nnx as nnx

            class ResNet(nn.Module):
                def __init__(self, block, layers, num_classes=1000):
                    super().__init__()

            def resnet18(**kwargs):
                return ResNet(BasicBlock, [2, 2, 2, 2], **kwargs)

            model = resnet18(num_classes=10, rngs=nnx.Rngs(0))
            """,
            title="a factory function passing **kwargs on; no seed: 0",
        ),
        Example(
            """
            import torch
            import flax.nnx as nnx


            def get_mlp(hidden, *, rngs: nnx.Rngs):
                return nnx.Sequential(nnx.Linear(784, hidden, rngs=rngs))


            def main(args):
                torch.manual_seed(args.seed)
                net = get_mlp(args.hidden)
            """,
            """
            import torch
            import flax.nnx as nnx


            def get_mlp(hidden, *, rngs: nnx.Rngs):
                return nnx.Sequential(nnx.Linear(784, hidden, rngs=rngs))


            def main(args):
                torch.manual_seed(args.seed)
                net = get_mlp(args.hidden, rngs=nnx.Rngs(args.seed))
            """,
            title='a factory the module rules gave a required rngs',
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            class Net(nn.Module):
                def __init__(self, hidden):
                    super().__init__()
                    self.fc = nn.Linear(4, hidden)

                @classmethod
                def from_config(cls, cfg):
                    return cls(cfg["hidden"])

            torch.manual_seed(7)
            model = Net.from_config({"hidden": 8})
            """,
            """
            import torch
            import torch.nn as nn
            import flax.nnx as nnx

            class Net(nn.Module):
                def __init__(self, hidden):
                    super().__init__()
                    self.fc = nn.Linear(4, hidden)

                @classmethod
                def from_config(cls, cfg):
                    return cls(cfg["hidden"])

            torch.manual_seed(7)
            model = Net.from_config({"hidden": 8}, rngs=nnx.Rngs(7))
            """,
            title="a classmethod building the model, called through the class",
        ),
    ]
    valid = [
        "import torch.nn as nn\nclass A(nn.Module):\n    pass\nclass B(nn.Module):\n    def __init__(self):\n        self.a = A()\n",
        "from flax import nnx\nclass A(nnx.Module):\n    pass\nm = A(rngs=nnx.Rngs(0))\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted_name(node.func)
        ported = _nnx.ported_library_call(node.func, self.ctx)
        if name is None and not ported:
            return
        facts = lp.file_facts(self.ctx)
        factories = _program.factories(self.ctx)
        if not ported and name not in facts.module_classes and name not in factories \
                and name not in _program.imported_models(self.ctx) and not self._class_method(node.func):
            return
        name = name or lp.code(node.func)
        if any(a.keyword is not None and a.keyword.value == "rngs" for a in node.args):
            return
        fn = self.ctx.enclosing(cst.FunctionDef)
        if any(a.star == "**" and self._passes_kwargs_on(a.value, fn) for a in node.args):
            return  # the function's own **kwargs may carry rngs (a factory passing its arguments on)
        cls = self.ctx.enclosing(cst.ClassDef)
        if cls is not None and cls.name.value in facts.module_classes:
            return  # inside a model: the module rules pass the model's own rngs
        if fn is not None and any(p.name.value == "rngs" for p in lp._params(fn.params)):
            return
        if fn is not None and fn.name.value in factories:
            return  # a factory gets an rngs parameter from the module rules (JX001) and passes it on
        nnx = lp.nnx_name(self.ctx)
        seed = self._seed(node) or "0"
        new_arg = cst.Arg(cst.parse_expression(f"{nnx}.Rngs({seed})"), keyword=cst.Name("rngs"),
                          equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
        args = list(node.args)
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        self.report(node, f"an NNX model draws its parameters from an nnx.Rngs passed to {name}(...)",
                    Fix((self.replace(node, node.with_changes(args=[*args, new_arg])),), Safety.SAFE, ("flax.nnx",)))

    def _class_method(self, func: cst.BaseExpression) -> bool:
        """``Net.build(...)``: a classmethod or staticmethod of a model class of the file that
        builds the model (it takes rngs once ported)."""
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
            return False
        key = ("jx304.class_methods",)
        if key not in self.ctx.cache:
            self.ctx.cache[key] = _nnx.rngs_plan(self.ctx).class_methods()
        return func.attr.value in self.ctx.cache[key].get(func.value.value, ())

    @staticmethod
    def _passes_kwargs_on(value: cst.BaseExpression, fn: Optional[cst.FunctionDef]) -> bool:
        """``**value`` hands on the enclosing function's own ``**kwargs`` (which its callers may
        give rngs in); a dict the script built (``GPT(**model_args)``) holds no rngs."""
        if fn is None or not isinstance(value, cst.Name):
            return fn is not None  # inside a function, an expression may still carry the caller's
        star = fn.params.star_kwarg
        if star is not None and star.name.value == value.value:
            return True
        return any(p.name.value == value.value for p in lp._params(fn.params))

    def _seed(self, node: cst.Call) -> Optional[str]:
        scope = self.ctx.enclosing(cst.FunctionDef)
        body = scope.body if scope is not None else self.ctx.module
        for call in astutil.calls_in(body):
            if self.ctx.qualname(call.func) in ("torch.manual_seed", "torch.random.manual_seed") and call.args:
                return lp.code(call.args[0].value)
        return None
