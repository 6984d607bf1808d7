from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc

_LAZY_WORDS = ("Lazy",)


def _expr_call(stmt: cst.CSTNode) -> Optional[cst.Call]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr):
        value = stmt.body[0].value
        if isinstance(value, cst.Call):
            return value
    return None


def _loader_of(iterable: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """``loader`` of ``loader`` / ``enumerate(loader, ...)``."""
    if isinstance(iterable, cst.Call) and dotted_name(iterable.func) == "enumerate" and iterable.args:
        return _loader_of(iterable.args[0].value)
    if isinstance(iterable, (cst.Name, cst.Attribute)):
        return iterable
    return None


def _target_position(target: cst.BaseExpression, name: str) -> Optional[int]:
    """Where ``name`` sits in a loop target ``(data, label)`` / ``i, (data, label)``."""
    if isinstance(target, (cst.Tuple, cst.List)):
        elements = [e.value for e in target.elements]
        names = [e.value if isinstance(e, cst.Name) else None for e in elements]
        if name in names:
            return names.index(name)
        if len(elements) == 2 and isinstance(elements[1], (cst.Tuple, cst.List)):  # enumerate's (i, batch)
            return _target_position(elements[1], name)
    return None


def _batch_item(loop: cst.For, value: cst.BaseExpression) -> Optional[int]:
    """K for ``batch[K]`` where ``batch`` is the loop's batch (``for batch in loader``, ``for i,
    batch in enumerate(loader)``)."""
    target = loop.target
    if isinstance(target, cst.Tuple) and len(target.elements) == 2:
        target = target.elements[1].value
    if not (isinstance(value, cst.Subscript) and isinstance(target, cst.Name) and isinstance(value.value, cst.Name)
            and value.value.value == target.value and len(value.slice) == 1
            and isinstance(value.slice[0].slice, cst.Index) and isinstance(value.slice[0].slice.value, cst.Integer)):
        return None
    return int(value.slice[0].slice.value.value)


def _unmoved(value: cst.BaseExpression) -> cst.BaseExpression:
    """``x`` of ``x.as_in_context(ctx)`` / ``x.to(device)`` (chained or not)."""
    while isinstance(value, cst.Call) and astutil.method_name(value) in ("to", "as_in_context", "as_in_ctx"):
        value = value.func.value
    return value


def _item_position(loop: cst.For, name: str) -> Optional[int]:
    """K for ``name = batch[K]`` in the loop (``.as_in_context(ctx)`` / ``.to(device)`` after it
    or not), ``batch`` being the loop's batch."""
    for n in astutil.walk(loop.body):
        if isinstance(n, cst.Assign) and len(n.targets) == 1 and dotted_name(n.targets[0].target) == name:
            position = _batch_item(loop, _unmoved(n.value))
            if position is not None:
                return position
    return None


def _shard_position(loop: cst.For, name: str) -> Optional[int]:
    """The model fed the shards of a context list (``data = split_and_load(batch[0], ctx)``,
    or its port ``data = [batch[0].to(ctx[0])]``; ``[net(X) for X in data]``): the position
    of ``data`` in the batch."""
    for comp in astutil.walk(loop.body):
        if not (isinstance(comp, cst.CompFor) and isinstance(comp.target, cst.Name) and comp.target.value == name
                and isinstance(comp.iter, cst.Name)):
            continue
        shards = comp.iter.value
        for n in astutil.walk(loop.body):
            if not (isinstance(n, cst.Assign) and len(n.targets) == 1 and dotted_name(n.targets[0].target) == shards):
                continue
            value = n.value
            if isinstance(value, cst.List) and len(value.elements) == 1 and isinstance(value.elements[0].value, cst.Call) \
                    and astutil.method_name(value.elements[0].value) == "to":
                moved = value.elements[0].value.func.value
            elif isinstance(value, cst.Call) and (dotted_name(value.func) or "").endswith("split_and_load") and value.args:
                moved = value.args[0].value
            else:
                continue
            position = _batch_item(loop, moved)
            if position is not None:
                return position
    return None


class GluonDeferredShapes(Rule):
    """
    ## What it does
    Gives a ported model whose layers learn their input sizes at the first forward (Gluon's
    deferred initialization: `Dense(units)` without `in_units`, ported as torch lazy
    modules) its shapes from one sample, on the CPU, before it is moved to the device:

        initialize(net, init_xavier())           initialize(net, init_xavier())
        net.to(device)                    ->     with torch.no_grad():  # Gluon's deferred shapes ...
                                                     net.eval()
                                                     net(torch.utils.data.default_collate([train_data.dataset[0]])[0])
                                                     net.train()
                                                 net.to(device)

    The sample is the first item of the dataset of the loader that feeds the model in the
    training loop of the same function (`for i, (data, label) in enumerate(train_data)` ...
    `net(data)`), at the position of the model's input in the batch: indexing a dataset draws
    no random numbers, so the data order is unchanged; evaluation mode and `no_grad` leave
    BatchNorm's statistics, dropout's generator and the gradients alone. Applies where the
    port builds lazy modules (`nn.Lazy*`, the emitted `LazyDense`) and the model is moved with
    a `net.to(device)` statement after its `initialize(net, ...)`. The shards of a context
    list (`data = split_and_load(batch[0], ctx)`, `[net(X) for X in data]`) are read as the
    batch's item 0, an input read from the batch (`data = batch[0].as_in_context(ctx)`) as its
    item, an input moved where the model is called (`net(data.as_in_context(ctx))`) as the
    input. A loader made after the move (the script builds its data after its model) is
    reported there: the sample does not exist yet. A model whose input is not
    a batch of such a loader (a generator fed with noise drawn in the loop) is left as it is.

    ## Why
    torch_xla (2.9) cannot move a lazy module before its first forward: the deferred shape
    is lost on the XLA device and the first step fails. On the CPU the lazy layers take
    their shapes (and their initialization) from the sample, and the model moves whole.

    ## Fix safety
    Safe: one forward in evaluation mode without gradients; the parameters get the shapes
    and initial values the first training forward would give them.
    """

    code = "GL307"
    name = "gluon-deferred-shapes"
    target = "torch"
    summary = "lazy (deferred-shape) models: one CPU sample through the model before net.to(device)"
    severity = Severity.ERROR
    needs_text = _LAZY_WORDS
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            # an mxnet script after the front end's first pass (Rule.needs_document)
            import torch

            def get_net():
                return torch.nn.Sequential(torch.nn.LazyConv2d(8, 3))

            def train(net, train_data, ctx):
                initialize(net)
                net.to(ctx[0])
                for i, batch in enumerate(train_data):
                    data = [batch[0].to(ctx[0])]
                    label = [batch[1].to(ctx[0])]
                    output = [net(X) for X in data]
            """,
            """
            # an mxnet script after the front end's first pass (Rule.needs_document)
            import torch
            import torch.utils.data

            def get_net():
                return torch.nn.Sequential(torch.nn.LazyConv2d(8, 3))

            def train(net, train_data, ctx):
                initialize(net)
                # Gluon's deferred shapes: the lazy layers take theirs from one sample, on the CPU, before the move
                with torch.no_grad():
                    net.eval()
                    net(torch.utils.data.default_collate([train_data.dataset[0]])[0])
                    net.train()
                net.to(ctx[0])
                for i, batch in enumerate(train_data):
                    data = [batch[0].to(ctx[0])]
                    label = [batch[1].to(ctx[0])]
                    output = [net(X) for X in data]
            """,
            title="the shards of a context list (split_and_load, GL003)",
        ),
        Example(
            """
            # an mxnet script after the front end's first pass (Rule.needs_document)
            import torch

            def main(train_data, device):
                net = torch.nn.Sequential(torch.nn.LazyLinear(10))
                initialize(net)
                net.to(device)
                for i, (data, label) in enumerate(train_data, start=1):
                    data = data.to(device)
                    output = net(data)
            """,
            """
            # an mxnet script after the front end's first pass (Rule.needs_document)
            import torch
            import torch.utils.data

            def main(train_data, device):
                net = torch.nn.Sequential(torch.nn.LazyLinear(10))
                initialize(net)
                # Gluon's deferred shapes: the lazy layers take theirs from one sample, on the CPU, before the move
                with torch.no_grad():
                    net.eval()
                    net(torch.utils.data.default_collate([train_data.dataset[0]])[0])
                    net.train()
                net.to(device)
                for i, (data, label) in enumerate(train_data, start=1):
                    data = data.to(device)
                    output = net(data)
            """,
        ),
        Example(
            """
            # an mxnet script after the front end's first pass (Rule.needs_document)
            import torch

            def main(loader, device, nz):
                netG = torch.nn.Sequential(torch.nn.LazyConvTranspose2d(8, 4))
                initialize(netG)
                netG.to(device)
                for data, _ in loader:
                    noise = torch.randn((data.shape[0], nz, 1, 1), device=device)
                    fake = netG(noise)
            """,
            """
            # an mxnet script after the front end's first pass (Rule.needs_document)
            import torch

            def main(loader, device, nz):
                netG = torch.nn.Sequential(torch.nn.LazyConvTranspose2d(8, 4))
                initialize(netG)
                # Gluon's deferred shapes: the lazy layers take theirs from one sample, on the CPU, before the move
                with torch.no_grad():
                    netG.eval()
                    netG(torch.zeros((1, nz, 1, 1)))
                    netG.train()
                netG.to(device)
                for data, _ in loader:
                    noise = torch.randn((data.shape[0], nz, 1, 1), device=device)
                    fake = netG(noise)
            """,
            title="a generator fed with noise drawn in the loop: zeros of its shape, batch 1",
        ),
        Example(
            """
            # an mxnet script after the front end's first pass (Rule.needs_document)
            import torch

            net = torch.nn.Sequential(torch.nn.LazyLinear(10))
            initialize(net)
            net.to(device)
            loader = torch.utils.data.DataLoader(dataset, batch_size=16)
            for data, label in loader:
                output = net(data)
            """,
            None,
            title="a loader made after the move: reported",
        ),
    ]
    valid = [
        "import torch\nnet = torch.nn.Linear(2, 3)\ninitialize(net)\nnet.to(device)\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        if self._builds_lazy_modules():
            self._scan(list(node.body), None)  # a script that trains at module level

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if isinstance(node.body, cst.IndentedBlock) and self._builds_lazy_modules():
            # the names the body binds (a parameter is bound before it runs)
            bound = astutil.function_locals(node) - {p.name.value for p in astutil.params(node.params)}
            self._scan(list(node.body.body), bound)

    def _scan(self, body: list, local: Optional[set]) -> None:
        """``initialize(net, ...)`` then ``net.to(device)`` among the statements of one body
        (``local``: the function's local names, bound in the body; None for the module's)."""
        for i, stmt in enumerate(body):
            move = _expr_call(stmt)
            if move is None or astutil.method_name(move) != "to" or len(move.args) != 1 or i == 0:
                continue
            model = dotted_name(move.func.value)
            init = _expr_call(body[i - 1])
            if model is None or init is None or dotted_name(init.func) != "initialize" or not init.args \
                    or dotted_name(init.args[0].value) != model:
                continue
            sample = self._sample(body[i + 1:], model)
            if sample is None:
                continue
            torch = sc.torch_name(self.ctx)
            data = self.ctx.module_alias("torch.utils.data")
            if isinstance(sample, str):  # an input drawn in the loop: zeros of its shape, batch 1
                example, imports = sample, ("torch",)
            else:
                loader, position = sample
                root = astutil.root_name(loader)
                if (local is None or root in local) and not any(root in astutil.binds(s) for s in body[:i]):
                    self.report(stmt, f"{model} has lazy layers, and the loader that feeds it ({sc.code(loader)}) is "
                                      f"made after {model}.to(...): give the layers their input sizes (in_units=, "
                                      f"in_channels=), or build the loader before the model")
                    continue
                example, imports = f"{data}.default_collate([{sc.code(loader)}.dataset[0]])[{position}]", ("torch", "torch.utils.data")
            block = cst.parse_statement(
                f"with {torch}.no_grad():\n"
                f"    {model}.eval()\n"
                f"    {model}({example})\n"
                f"    {model}.train()\n")
            block = block.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
                "# Gluon's deferred shapes: the lazy layers take theirs from one sample, on the CPU, before the move"))])
            self.report(stmt, f"{model} has lazy layers: one sample through it on the CPU before {model}.to(...)",
                        Fix((self.replace(stmt, astutil.insert_before([block])),), imports=imports))

    def _builds_lazy_modules(self) -> bool:
        """The file constructs a lazy module (a call of `nn.LazyLinear`, `LazyDense`, ...)."""
        key = ("gluon.builds_lazy", self.ctx.module)
        if key not in self.ctx.cache:
            self.ctx.cache[key] = any(
                isinstance(c, cst.Call) and (dotted_name(c.func) or "").split(".")[-1].startswith("Lazy")
                for c in astutil.walk(self.ctx.module, into_functions=True))
        return self.ctx.cache[key]

    def _sample(self, after: list, model: str):
        for stmt in after:
            for loop in astutil.walk(stmt):
                if not isinstance(loop, cst.For):
                    continue
                loader = _loader_of(loop.iter)
                if loader is None:
                    continue
                for call in astutil.calls_in(loop.body):
                    arg = _unmoved(call.args[0].value) if call.args else None
                    if dotted_name(call.func) == model and isinstance(arg, cst.Name):
                        name = arg.value
                        position = _target_position(loop.target, name)
                        if position is not None:
                            return loader, position
                        drawn = self._drawn(loop, name)
                        if drawn is not None:
                            return drawn
                        shard = _shard_position(loop, name)
                        if shard is not None:
                            return loader, shard
                        item = _item_position(loop, name)
                        if item is not None:
                            return loader, item
        return None

    def _drawn(self, loop: cst.For, name: str) -> Optional[str]:
        """For ``name = torch.randn((batch, c, h, w), device=d)`` in the loop (randn, rand,
        zeros, ones): ``torch.zeros((1, c, h, w))``, when c, h, w are read from names the loop
        does not bind."""
        bound_in_loop = {n for s in astutil.walk(loop) if isinstance(s, cst.Assign)
                         for t in s.targets for n in astutil.target_names(t.target)}
        bound_in_loop |= set(astutil.target_names(loop.target))
        for n in astutil.walk(loop.body):
            if not (isinstance(n, cst.Assign) and len(n.targets) == 1 and dotted_name(n.targets[0].target) == name):
                continue
            value = n.value
            q = sc.qualname(self.ctx, value.func) if isinstance(value, cst.Call) else None
            if q not in ("torch.randn", "torch.rand", "torch.zeros", "torch.ones") or not value.args:
                return None
            shape = value.args[0].value
            if not isinstance(shape, (cst.Tuple, cst.List)) or len(shape.elements) < 2:
                return None
            rest = shape.elements[1:]
            reads = {x.value for e in rest for x in astutil.walk(e.value) if isinstance(x, cst.Name)}
            if reads & bound_in_loop:
                return None
            dims = ", ".join(["1", *(sc.code(e.value) for e in rest)])
            return f"{sc.torch_name(self.ctx)}.zeros(({dims}))"
        return None
