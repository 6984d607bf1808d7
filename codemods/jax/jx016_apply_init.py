from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.astutil import code as _code
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity

from . import _nnx

# tensor methods that initialise in place -> (nn.init function, how many positional arguments it takes after the tensor)
_METHODS = {"normal_": ("normal_", 2), "uniform_": ("uniform_", 2), "fill_": ("constant_", 1), "zero_": ("zeros_", 0)}
# their keywords -> nn.init's (`from` cannot be written as a keyword)
_KEYWORDS = {"normal_": {"mean": "mean", "std": "std"}, "uniform_": {"to": "b"}, "fill_": {"value": "val"}, "zero_": {}}


class ApplyInit(Rule):
    """
    ## What it does
    Ports initialisation through `model.apply(init_fn)` and in-place tensor initialisers, so
    that JX012 translates them with the module's `rngs`:

    - `net.apply(weights_init)` (a def of the file taking the module) ->
      `for _, module in nnx.iter_modules(net): weights_init(module, rngs=...)` (an NNX
      module has no `apply`; torch's visits every submodule once, as `iter_modules` does), with
      the `rngs` in scope or a `nnx.Rngs` seeded like JX304's (`torch.manual_seed`'s seed,
      else 0), and `weights_init` gets a keyword-only `rngs: nnx.Rngs` parameter;
    - in such a function and in the methods of the file's module classes,
      `m.weight.data.normal_(0.0, 0.02)` -> `nn.init.normal_(m.weight, 0.0, 0.02)`, and likewise
      `.uniform_(a, b)` -> `nn.init.uniform_`, `.fill_(v)` -> `nn.init.constant_`, `.zero_()` ->
      `nn.init.zeros_`: the torch spelling JX012 ports (`init_normal_(m, "weight", 0.0, 0.02,
      key=rngs.params())`). The class tests stay: `classname.find('Conv')` still finds
      `TorchConv2d`, `isinstance(m, nn.Conv2d)` becomes `isinstance(m, TorchConv2d)` (JX012).

    - `self.apply(self._init_weights)` in a module's `__init__` or a method it calls (a method
      taking `(self, module)`, a staticmethod taking `(module)`; `self.apply(fn)` of a def of the
      file) -> `for _, module in nnx.iter_modules(self): self._init_weights(module)`; the rngs
      plan (JX001) gives the method, and this call, the constructor's `rngs` when it draws.
      `self.apply(...)` in `forward` is reported (no rngs there; torch re-initialises on
      every call).

    A `.apply(f)` whose function is not a one-parameter def of the file or such a method (a
    lambda, an imported function) is reported at its line.

    ## Why
    `Module.apply` is torch's: NNX modules have none, and a JAX port that keeps
    `net.apply(weights_init)` fails at that line; in-place initialisers on `.data` have no
    JAX counterpart (arrays are immutable, random numbers need a key).

    ## Fix safety
    Safe: `t.data.normal_(a, b)` and `nn.init.normal_(t, a, b)` (keywords: `mean=`, `std=`; `to=`
    -> `b=`; `value=` -> `val=`) draw from the same
    distribution in place without autograd (likewise for uniform_, fill_ / constant_,
    zero_ / zeros_); torch's `apply` and `nnx.iter_modules` call the function once per
    module. The values are drawn by JAX's generator, not torch's (the tests load the
    original's weights to compare).
    """

    code = "JX016"
    name = "apply-init-to-nnx"
    target = "jax"
    summary = "net.apply(weights_init) and t.data.normal_(...)-style init -> nnx.iter_modules + nn.init (then JX012)"
    severity = Severity.ERROR
    needs_text = (".apply(", "normal_(", "uniform_(", "fill_(", "zero_(")
    examples = [
        Example(
            """
            import torch
            import torch.nn as nn

            def weights_init(m):
                classname = m.__class__.__name__
                if classname.find('Conv') != -1:
                    m.weight.data.normal_(0.0, 0.02)
                elif classname.find('BatchNorm') != -1:
                    m.weight.data.normal_(1.0, 0.02)
                    m.bias.data.fill_(0)

            torch.manual_seed(7)
            netG = Generator()
            netG.apply(weights_init)
            """,
            """
            import torch
            import torch.nn as nn
            import flax.nnx as nnx

            def weights_init(m, *, rngs: nnx.Rngs):
                classname = m.__class__.__name__
                if classname.find('Conv') != -1:
                    nn.init.normal_(m.weight, 0.0, 0.02)
                elif classname.find('BatchNorm') != -1:
                    nn.init.normal_(m.weight, 1.0, 0.02)
                    nn.init.constant_(m.bias, 0)

            torch.manual_seed(7)
            netG = Generator()
            init_rngs = nnx.Rngs(7)
            for _, module in nnx.iter_modules(netG):
                weights_init(module, rngs=init_rngs)
            """,
            title="the DCGAN-style weights_init through net.apply",
        ),
        Example(
            """
            import torch.nn as nn

            class LM(nn.Module):
                def __init__(self, ntoken, nhid):
                    super().__init__()
                    self.encoder = nn.Embedding(ntoken, nhid)
                    self.decoder = nn.Linear(nhid, ntoken)
                    self.init_weights()

                def init_weights(self):
                    self.encoder.weight.data.uniform_(-0.1, 0.1)
                    self.decoder.bias.data.zero_()
            """,
            """
            import torch.nn as nn

            class LM(nn.Module):
                def __init__(self, ntoken, nhid):
                    super().__init__()
                    self.encoder = nn.Embedding(ntoken, nhid)
                    self.decoder = nn.Linear(nhid, ntoken)
                    self.init_weights()

                def init_weights(self):
                    nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
                    nn.init.zeros_(self.decoder.bias)
            """,
            title="in-place initialisers in a module's method: the nn.init spelling",
        ),
        Example(
            """
            import torch.nn as nn

            class GPT(nn.Module):
                def __init__(self, vocab, d):
                    super().__init__()
                    self.wte = nn.Embedding(vocab, d)
                    self.head = nn.Linear(d, vocab)
                    self.apply(self._init_weights)

                def _init_weights(self, module):
                    if isinstance(module, nn.Linear):
                        module.weight.data.normal_(mean=0.0, std=0.02)
                        module.bias.data.zero_()
                    elif isinstance(module, nn.Embedding):
                        nn.init.normal_(module.weight, std=0.02)
            """,
            """
            import torch.nn as nn
            import flax.nnx as nnx

            class GPT(nn.Module):
                def __init__(self, vocab, d):
                    super().__init__()
                    self.wte = nn.Embedding(vocab, d)
                    self.head = nn.Linear(d, vocab)
                    for _, module in nnx.iter_modules(self):
                        self._init_weights(module)

                def _init_weights(self, module):
                    if isinstance(module, nn.Linear):
                        nn.init.normal_(module.weight, mean=0.0, std=0.02)
                        nn.init.zeros_(module.bias)
                    elif isinstance(module, nn.Embedding):
                        nn.init.normal_(module.weight, std=0.02)
            """,
            title="self.apply(self._init_weights) in a constructor: a loop over the module's submodules (JX001 passes the rngs)",
        ),
        Example(
            """
            import torch.nn as nn

            class Net(nn.Module):
                def forward(self, x):
                    return x

            model = Net()
            model.apply(lambda m: print(m))
            """,
            None,
            title="apply() of a function porter cannot see: reported",
        ),
    ]
    valid = [
        "import torch\nx = torch.zeros(3)\nx.normal_(0, 1)\n",  # not in an init function or a module
        "import pandas as pd\ndf.apply(f)\n",
    ]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Expr):
            return
        call = node.body[0].value
        if not (isinstance(call, cst.Call) and astutil.method_name(call) == "apply" and len(call.args) == 1
                and call.args[0].keyword is None):
            return
        if not self._torch_file():
            return
        fn = call.args[0].value
        model = call.func.value  # type: ignore[attr-defined]
        own = _code(model) == "self" and _nnx.enclosing_module_class(self.ctx) is not None
        init = _nnx.apply_init_target(self.ctx, fn)
        if init is None:
            if own or _is_model(self.ctx, model):
                self.report(call, f"{_code(model)}.apply({_code(fn)}): NNX modules have no apply(); porter ports "
                                  "apply() of a one-parameter def of the file or a method of the class: write "
                                  "`for _, m in nnx.iter_modules(model): ...`")
            return
        if not (own or _is_model(self.ctx, model) or _initialises(init)):
            return
        func = _nnx.enclosing_function(self.ctx)
        if own and func is not None and func.name.value in ("forward", "__call__"):
            self.report(call, f"self.apply({_code(fn)}) in {func.name.value}: the port's forward has no rngs to draw "
                              "initial values from; initialise in __init__ (torch re-initialises on every call)")
            return
        nnx = _nnx.nnx_name(self.ctx)
        if isinstance(fn, cst.Attribute):
            # a method of the class: the rngs plan (JX001) gives it, and this call, rngs if it draws
            pre, args = [], "module"
        elif own or _nnx.in_rngs_scope(self.ctx):
            # a module's method: its rngs (the plan gives the method one for the call's rngs=)
            pre, args = [], "module, rngs=rngs"
        else:
            where = _nnx.scope_statement(self.ctx) or (_nnx.enclosing_function(self.ctx) or self.ctx.module, node)
            made = self.ctx.cache.setdefault(("jx016.init_rngs",), set())
            if id(where[0]) in made or _assigns(where[0], "init_rngs"):
                pre = []  # one stream for every apply() of the scope
            else:
                made.add(id(where[0]))
                pre = [cst.parse_statement(f"init_rngs = {nnx}.Rngs({_nnx.seed_in(*where, self.ctx)})")]
            args = "module, rngs=init_rngs"
        loop = cst.parse_statement(f"for _, module in {nnx}.iter_modules({_code(model)}):\n    {_code(fn)}({args})\n")
        new = [*pre, loop]
        new[0] = new[0].with_changes(leading_lines=node.leading_lines)
        edits = [Edit(node, cst.FlattenSentinel(new))]
        if "rngs=" in args and not _nnx.has_param(init, "rngs"):
            edits.append(Edit(init, _nnx.add_rngs_param(nnx)))
        self.report(call, f"{_code(model)}.apply({_code(fn)}): NNX modules have no apply() -> nnx.iter_modules",
                    Fix(tuple(edits), Safety.SAFE, ("flax.nnx",)))

    def leave_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        # a marker another rule put on an initialiser line in the pass this rule rewrote it (JX102:
        # `Tensor.normal_` needs a key), left on the line JX012 has since ported: dropped
        tw = node.trailing_whitespace
        if tw.comment is None or "porter: manual" not in tw.comment.value or len(node.body) != 1 \
                or not isinstance(node.body[0], cst.Expr) or not isinstance(node.body[0].value, cst.Call):
            return
        call = node.body[0].value
        if not (isinstance(call.func, cst.Name) and call.func.value.startswith("init_") and call.func.value != "init_torch_param_"):
            return
        func = _nnx.enclosing_function(self.ctx)
        if func is None or not call.args or not self._init_scope(func, call.args[0].value, module_arg=True):
            return
        random = any(a.keyword is not None and a.keyword.value == "key" for a in call.args)
        if random and not _nnx.has_param(func, "rngs") and not _nnx.in_rngs_scope(self.ctx):
            return
        self.report(node, f"{call.func.value}(...) is ported: the manual-port marker is stale",
                    Fix((Edit(node, node.with_changes(trailing_whitespace=tw.with_changes(
                        whitespace=cst.SimpleWhitespace(""), comment=None))),), Safety.SAFE))

    def visit_Call(self, node: cst.Call) -> None:
        method = astutil.method_name(node)
        if method not in _METHODS or not self._torch_file():
            return
        tensor = node.func.value  # type: ignore[attr-defined]
        if isinstance(tensor, cst.Attribute) and tensor.attr.value == "data":
            tensor = tensor.value
        if not isinstance(tensor, cst.Attribute):
            return
        parent = self.ctx.parent
        if not isinstance(parent, cst.Expr):
            return  # the value is used
        func = _nnx.enclosing_function(self.ctx)
        if func is None or not self._init_scope(func, tensor):
            return
        name, nargs = _METHODS[method]
        args = list(node.args)
        keywords = _KEYWORDS[method]
        if any(a.star or (a.keyword is not None and a.keyword.value not in keywords) for a in args) or len(args) > nargs:
            return
        nn = self.ctx.module_alias("torch.nn")
        texts = [_code(a.value) if a.keyword is None else f"{keywords[a.keyword.value]}={_code(a.value)}" for a in args]
        text = f"{nn}.init.{name}({', '.join([_code(tensor), *texts])})"
        self.report(node, f"{_code(node.func)}(...) initialises in place: {nn}.init.{name} (ported with the module's rngs)",
                    Fix((Edit(node, cst.parse_expression(text)),), Safety.SAFE, ("torch.nn",)))

    # ----------------------------------------------------------------------------------
    def _torch_file(self) -> bool:
        return any(q == "torch" or q.startswith(("torch.", "flax")) for q in self.ctx.aliases.values())

    def _init_scope(self, func: cst.FunctionDef, tensor: cst.CSTNode, module_arg: bool = False) -> bool:
        """A method of a module class of the file (the tensor an attribute of `self`), or a def
        the file passes to `.apply()` (the tensor an attribute of its parameter; ``module_arg``:
        ``tensor`` is the module itself, as the port's init_* functions take it)."""
        root = tensor
        while isinstance(root, cst.Attribute):
            root = root.value
        if not isinstance(root, cst.Name):
            return False
        cls = _nnx.enclosing_module_class_of(func, self.ctx)
        if cls is not None and root.value == "self":
            return True
        params = func.params.params
        # the module parameter of a def or method the file applies: (module) or (self, module)
        at = 1 if cls is not None and params and params[0].name.value == "self" else 0
        return len(params) > at and root.value == params[at].name.value and func.name.value in _applied(self.ctx)


def _assigns(scope: cst.CSTNode, name: str) -> bool:
    body = scope.body if isinstance(scope, cst.Module) else scope.body.body
    return any(isinstance(st, cst.SimpleStatementLine) and any(
        isinstance(sm, cst.Assign) and any(_code(t.target) == name for t in sm.targets) for sm in st.body) for st in body)


def _applied(ctx) -> frozenset:
    """Names of the defs the file passes to `.apply(name)`."""
    key = ("jx016.applied",)
    if key not in ctx.cache:
        names = set()
        for c in astutil.walk(ctx.module, into_functions=True):
            if isinstance(c, cst.Call) and astutil.method_name(c) == "apply" and len(c.args) == 1:
                names.update(_callee(c.args[0].value))
            # this rule's port of apply(): for _, module in nnx.iter_modules(net): fn(module, rngs=...)
            if isinstance(c, cst.For) and isinstance(c.iter, cst.Call) and astutil.method_name(c.iter) == "iter_modules":
                for inner in astutil.calls_in(c.body):
                    names.update(_callee(inner.func))
        ctx.cache[key] = frozenset(names)
    return ctx.cache[key]


def _callee(fn: cst.CSTNode) -> tuple:
    """The name of the def (``fn``) or method (``self.fn``) a call or apply() names."""
    if isinstance(fn, cst.Name):
        return (fn.value,)
    if isinstance(fn, cst.Attribute) and isinstance(fn.value, cst.Name) and fn.value.value == "self":
        return (fn.attr.value,)
    return ()


def _initialises(func: cst.FunctionDef) -> bool:
    """The def reads its module's weight / bias, its class or calls nn.init: an init function."""
    text = _code(func.body)
    return any(w in text for w in (".weight", ".bias", "__class__", "init."))


def _is_model(ctx, model: cst.CSTNode) -> bool:
    from . import _loop as lp

    facts = lp.file_facts(ctx)
    text = _code(model)
    return text in facts.modules or (isinstance(model, cst.Name) and bool(facts.module_classes)
                                     and any(isinstance(n, cst.Assign) and _code(n.targets[0].target) == text
                                             and isinstance(n.value, cst.Call) and isinstance(n.value.func, cst.Name)
                                             and n.value.func.value in facts.module_classes
                                             for n in astutil.walk(ctx.module, into_functions=True)))
