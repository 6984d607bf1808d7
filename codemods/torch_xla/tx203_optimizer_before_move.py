from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from porter import astutil, localimports
from porter.context import FileContext, dotted_name
from porter.rules import Edit, Example, Fix, Rule, Severity

from . import _training as tr

_SWAP = "set_swap_module_params_on_conversion"


class OptimizerBeforeMove(Rule):
    """
    ## What it does
    In a file that builds a `torch.optim` optimizer from `model.parameters()` and moves that
    module to its device (`model.to(device)`, `model.cuda()`) where porter cannot see that the
    move comes first (in another function, such as a trainer's `__init__` that receives the
    model and the optimizer already built, or after the optimizer in the same function), or
    that moves an instance of a class which builds an optimizer over its own parameters
    (`self.opt = Adam(self.parameters())`: `Layer(a, b).to(device)`), or that ties a parameter
    of one module to another's (`self.tok.weight = self.head.weight`: a language model's
    embedding and output layer share one weight), adds
    `torch.__future__.set_swap_module_params_on_conversion(True)` after the imports.

    ## Why
    On CUDA, `module.to(device)` moves each parameter in place: the optimizer built before
    the move still holds the model's parameters. On XLA it does not: measured in torch_xla
    2.9, after `m.to(torch_xla.device())` the module holds new `Parameter` objects and the
    optimizer keeps the old CPU ones, so `optimizer.step()` updates tensors the model no
    longer uses and the model never learns (the losses of a ported trainer diverge from the
    original's at the second step). With the swap flag, `Module.to` swaps the tensors into
    the existing parameters (`torch.utils.swap_tensors`), which keeps their identity as on
    CUDA (measured: the same object, updated by the optimizer built before the move).

    Tied weights break the same way, silently: measured in torch_xla 2.9, a module whose
    embedding and output layer share one Parameter has two after `.to(torch_xla.device())`
    (`m.tok.weight is m.head.weight` is False), each trained by its own gradient; the losses
    leave the original's at the second step. With the swap flag the one Parameter is kept
    (measured: still shared, on the XLA device). The flag is process-wide and set when the file
    is imported, so it also holds where the model is moved in another file. It also makes
    `load_state_dict` swap, which the parameters of an `nn.LSTM`/`GRU`/`RNN` refuse (they are
    weakly referenced: "Cannot swap t1 because it has weakref associated with it"): in a file
    that builds such layers, or imports a module of the program's tree that does, each
    `load_state_dict` statement runs with the flag off; so does a script whose imported model
    module sets the flag (a language model with tied weights in `model.py`, the script
    reloading its best state: porter.localimports reads the modules it imports).

    ## Fix safety
    Safe: only the way `Module.to`/`.cuda()` convert parameters changes: they keep the same
    `Parameter` objects with the new device's data, as the original relied on. Values are
    unchanged.
    """

    code = "TX203"
    name = "xla-optimizer-before-move"
    target = "torch-xla"
    summary = ("optimizer built before the model moves to XLA, or tied weights: keep parameter identity on "
               "conversion")
    severity = Severity.ERROR
    needs_text = ("parameters(", "weight =", "bias =", "weight=", "bias=")
    examples = [
        Example(
            """
            import torch

            class Trainer:
                def __init__(self, model, optimizer, device):
                    self.model = model.to(device)
                    self.optimizer = optimizer

            def main(device):
                model = Net()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                Trainer(model, optimizer, device)
            """,
            """
            import torch
            torch.__future__.set_swap_module_params_on_conversion(True)

            class Trainer:
                def __init__(self, model, optimizer, device):
                    self.model = model.to(device)
                    self.optimizer = optimizer

            def main(device):
                model = Net()
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                Trainer(model, optimizer, device)
            """,
            title="a trainer that moves the model it is given",
        ),
        Example(
            """
            import torch
            from torch import nn, optim

            net = nn.Linear(4, 2)
            opt = optim.Adam(net.parameters())
            net.cuda()
            """,
            """
            import torch
            from torch import nn, optim
            torch.__future__.set_swap_module_params_on_conversion(True)

            net = nn.Linear(4, 2)
            opt = optim.Adam(net.parameters())
            net.cuda()
            """,
            title="moved after the optimizer in the same scope",
        ),
        Example(
            """
            import torch
            from torch import nn

            class Layer(nn.Linear):
                def __init__(self, d_in, d_out):
                    super().__init__(d_in, d_out)
                    self.opt = torch.optim.Adam(self.parameters(), lr=0.03)

            def build(dims, device):
                return [Layer(dims[d], dims[d + 1]).to(device) for d in range(len(dims) - 1)]
            """,
            """
            import torch
            from torch import nn
            torch.__future__.set_swap_module_params_on_conversion(True)

            class Layer(nn.Linear):
                def __init__(self, d_in, d_out):
                    super().__init__(d_in, d_out)
                    self.opt = torch.optim.Adam(self.parameters(), lr=0.03)

            def build(dims, device):
                return [Layer(dims[d], dims[d + 1]).to(device) for d in range(len(dims) - 1)]
            """,
            title="a layer that builds its own optimizer (layer-local training), moved once built",
        ),
        Example(
            """
            import torch
            import torch.nn as nn

            class LM(nn.Module):
                def __init__(self, vocab, dim):
                    super().__init__()
                    self.embed = nn.Embedding(vocab, dim)
                    self.head = nn.Linear(dim, vocab, bias=False)
                    self.head.weight = self.embed.weight
            """,
            """
            import torch
            import torch.nn as nn
            torch.__future__.set_swap_module_params_on_conversion(True)

            class LM(nn.Module):
                def __init__(self, vocab, dim):
                    super().__init__()
                    self.embed = nn.Embedding(vocab, dim)
                    self.head = nn.Linear(dim, vocab, bias=False)
                    self.head.weight = self.embed.weight
            """,
            title="tied weights: one Parameter shared by the embedding and the output layer",
        ),
    ]
    valid = [
        # moved first, then the optimizer: nothing to keep
        "import torch\nmodel = Net().to(device)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "import torch\ndef main(device):\n    model = Net()\n    model.to(device)\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        # tensors moved, no module
        "import torch\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\nx = x.to(device)\n",
        # the flag is already set
        "import torch\ntorch.__future__.set_swap_module_params_on_conversion(True)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel.to(device)\n",
        # one module's weight given a fresh value, or a non-parameter attribute copied: nothing tied
        "import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc.weight = torch.nn.Parameter(torch.zeros(2, 2))\n        self.cfg.lr = args.lr\n",
        # a layer with its own optimizer, built where its tensors already are; tensors moved
        "import torch\nclass Layer(torch.nn.Linear):\n    def __init__(self):\n        super().__init__(2, 2)\n"
        "        self.opt = torch.optim.SGD(self.parameters(), lr=0.1)\nlayer = Layer()\nx = x.to(device)\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        if _has_flag(node, self.ctx):
            return
        reason = _flag_reason(node, self.ctx)
        torch = self.ctx.module_alias("torch")
        if reason is None:
            self._loads_beside_a_flag(node, torch)
            return
        at, why, instead = reason
        # the file's leading imports (after its docstring): the flag goes after them, before any
        # of the file's own code runs
        imports = []
        for stmt in node.body[_docstring_lines(node):]:
            if not (isinstance(stmt, cst.SimpleStatementLine)
                    and all(isinstance(b, (cst.Import, cst.ImportFrom)) for b in stmt.body)):
                break
            imports.append(stmt)
        if not imports:
            self.report(at, f"{why}; call torch.__future__.set_swap_module_params_on_conversion(True) before "
                        f"the move (or {instead})")
            return
        flag = cst.parse_statement(f"{torch}.__future__.{_SWAP}(True)\n")
        edits = [Edit(imports[-1], astutil.insert_after([flag]))]
        if _load_statements(node) and (_builds_recurrent_layers(node, self.ctx)
                                       or self._imported(_builds_recurrent_layers)):
            edits += _loads_without_flag(node, torch)
        self.report(
            at, f"{why}; torch.__future__.set_swap_module_params_on_conversion(True) keeps them (as on CUDA)",
            Fix(tuple(edits), imports=("torch",)),
        )

    def _loads_beside_a_flag(self, node: cst.Module, torch: str) -> None:
        """A file that loads state dicts into a program whose other files set the flag (a model
        module with tied weights) and build recurrent layers: its loads run with the flag off."""
        loads = _load_statements(node)
        if not loads or not self._imported(lambda m, c: _flag_reason(m, c) is not None):
            return
        if not (_builds_recurrent_layers(node, self.ctx) or self._imported(_builds_recurrent_layers)):
            return
        self.report(loads[0], "a module this file imports sets torch.__future__.set_swap_module_params_on_conversion"
                    "(True) (TX203, for its tied or late-moved parameters), which also makes load_state_dict swap "
                    "parameters, and an nn.LSTM/GRU/RNN's refuse it (\"Cannot swap t1 because it has weakref "
                    "associated with it\"): each load runs with the flag off, copying in place as on CUDA",
                    Fix(tuple(_loads_without_flag(node, torch)), imports=("torch",)))

    def _imported(self, test) -> bool:
        """``test(module, ctx)`` holds for a file of the program's tree that this file imports
        (porter.localimports)."""
        if not self.ctx.path or self.ctx.path.startswith("<"):
            return False
        for path in localimports.imported_files(self.ctx.module, self.ctx.path):
            module = localimports.parse(path)
            if module is not None and test(module, FileContext(module, str(path))):
                return True
        return False


def _has_flag(module: cst.Module, ctx) -> bool:
    return any((ctx.qualname(call.func) or "").endswith("." + _SWAP) for _scope, call in _calls_with_scope(module))


def _flag_reason(node: cst.Module, ctx) -> Optional[tuple[cst.CSTNode, str, str]]:
    """Where the file needs the swap flag, why, and what a person could do instead: a module
    moved after (or apart from) the optimizer built on its parameters, or a tied parameter
    (None: neither)."""
    opt_scopes: dict[str, list[tuple[Optional[cst.CSTNode], cst.Call]]] = {}
    moves: list[tuple[str, Optional[cst.CSTNode], cst.Call]] = []
    # an instance of a class that builds an optimizer over its own parameters, moved after it
    # is built (`Layer(a, b).to(device)`, `layer = Layer(a, b)` then `layer.to(device)`)
    owners = _self_optimizing_classes(node, ctx)
    late: Optional[cst.Call] = None
    for scope, call in _calls_with_scope(node):
        if tr.classify_value(call, ctx) == tr.OPTIMIZER:
            for module in _parameter_owners(call):
                opt_scopes.setdefault(module, []).append((scope, call))
        elif astutil.method_name(call) in ("to", "cuda") and isinstance(call.func, cst.Attribute):
            key = dotted_name(call.func.value)
            if key is not None:
                moves.append((key.rsplit(".", 1)[-1], scope, call))
            if late is None and _builds(call.func.value, owners, scope or node):
                late = call
    for name, scope, call in moves if late is None else ():
        for opt_scope, opt_call in opt_scopes.get(name, ()):
            if opt_scope is not scope or _position(node, opt_call) < _position(node, call):
                late = call
                break
        if late is not None:
            break
    if late is not None:
        return (late, "this module moves to its device after (or apart from) the optimizer built on its parameters: "
                "on XLA `.to()` gives the module new Parameter objects and the optimizer would update the old CPU ones",
                "build the optimizer after it")
    tied = _tied_parameter(node)
    if tied is not None:
        return (tied, "a parameter shared by two modules (tied weights): on XLA `.to()` gives each module a new "
                "Parameter of its own, and the two train apart from the first step on", "tie them again after it")
    return None


def _loads_without_flag(module: cst.Module, torch: str) -> list[Edit]:
    """Each ``load_state_dict`` statement between the flag off and on again: the flag also makes
    load_state_dict swap, which an RNN's parameters refuse (it keeps weak references to them:
    "Cannot swap t1 because it has weakref associated with it", measured in torch 2.9); loads
    copy in place, as without the flag."""
    on = cst.parse_statement(f"{torch}.__future__.{_SWAP}(True)\n")
    off = cst.parse_statement(f"{torch}.__future__.{_SWAP}(False)\n")
    return [Edit(load, cst.FlattenSentinel([off.with_changes(leading_lines=load.leading_lines),
                                            load.with_changes(leading_lines=[]), on]))
            for load in _load_statements(module)]


_RECURRENT = ("torch.nn.LSTM", "torch.nn.GRU", "torch.nn.RNN")


def _builds_recurrent_layers(module: cst.Module, ctx) -> bool:
    return any(isinstance(n, cst.Call) and (ctx.qualname(n.func) or "") in _RECURRENT
               or isinstance(n, cst.Attribute) and ctx.qualname(n) in _RECURRENT
               for n in astutil.walk(module, into_functions=True))


def _load_statements(module: cst.Module) -> list[cst.SimpleStatementLine]:
    """Statement lines that call ``.load_state_dict(...)`` of a module."""
    return [n for n in astutil.walk(module, into_functions=True) if isinstance(n, cst.SimpleStatementLine)
            and any(isinstance(c, cst.Call) and astutil.method_name(c) == "load_state_dict" for c in astutil.walk(n))]


def _is_parameter_name(name: str) -> bool:
    return name in ("weight", "bias") or name.endswith(("_weight", "_bias"))


def _tied_parameter(module: cst.Module) -> Optional[cst.Assign]:
    """The first assignment that ties a parameter of one module to another's:
    ``self.tok.weight = self.head.weight``, ``model.decoder.weight = model.encoder.weight``
    (a weight or bias attribute of one module path given another module path's)."""
    for n in astutil.walk(module, into_functions=True):
        if not isinstance(n, cst.Assign) or len(n.targets) != 1:
            continue
        target, value = n.targets[0].target, n.value
        if not isinstance(target, cst.Attribute) or not isinstance(value, cst.Attribute):
            continue
        if not _is_parameter_name(target.attr.value) or not _is_parameter_name(value.attr.value):
            continue
        owner, other = dotted_name(target.value), dotted_name(value.value)
        if owner is not None and other is not None and owner != other:
            return n
    return None


def _self_optimizing_classes(module: cst.Module, ctx) -> set[str]:
    """The names of the classes of ``module`` whose methods build a torch.optim optimizer over
    the instance's own parameters (``self.opt = Adam(self.parameters(), lr=lr)``)."""
    return {cls.name.value for cls in astutil.walk(module, into_functions=True) if isinstance(cls, cst.ClassDef)
            and any(isinstance(n, cst.Call) and tr.classify_value(n, ctx) == tr.OPTIMIZER
                    and "self" in _parameter_owners(n) for n in astutil.walk(cls, into_functions=True))}


def _builds(receiver: cst.BaseExpression, classes: set[str], scope: cst.CSTNode) -> bool:
    """``receiver`` is an instance of one of ``classes``: a call of one, or a name ``scope``
    binds only to such calls."""
    def instance(value) -> bool:
        return isinstance(value, cst.Call) and (dotted_name(value.func) or "").rsplit(".", 1)[-1] in classes

    if not classes:
        return False
    if isinstance(receiver, cst.Name):
        values = astutil.assigned_values(scope, receiver.value)
        return bool(values) and all(instance(v) for v in values)
    return instance(receiver)


def _docstring_lines(module: cst.Module) -> int:
    first = module.body[0] if module.body else None
    if (isinstance(first, cst.SimpleStatementLine) and isinstance(first.body[0], cst.Expr)
            and isinstance(first.body[0].value, (cst.SimpleString, cst.ConcatenatedString))):
        return 1
    return 0


def _parameter_owners(call: cst.Call) -> Iterator[str]:
    """Last names of the modules whose ``.parameters()`` (or ``named_parameters``) the
    optimizer's arguments read: ``model``, ``self.net`` -> ``net``."""
    for n in astutil.walk(call):
        if isinstance(n, cst.Call) and astutil.method_name(n) in ("parameters", "named_parameters"):
            key = dotted_name(n.func.value)  # type: ignore[attr-defined]
            if key is not None:
                yield key.rsplit(".", 1)[-1]


def _calls_with_scope(module: cst.Module) -> Iterator[tuple[Optional[cst.CSTNode], cst.Call]]:
    """Every call, with its innermost function (None: the module's code)."""
    stack: list[tuple[cst.CSTNode, Optional[cst.CSTNode]]] = [(module, None)]
    while stack:
        n, scope = stack.pop()
        if isinstance(n, cst.Call):
            yield scope, n
        inner = n if isinstance(n, (cst.FunctionDef, cst.Lambda)) else scope
        stack.extend((c, inner) for c in reversed(astutil.children(n)))


def _position(module: cst.Module, target: cst.CSTNode) -> int:
    for i, n in enumerate(astutil.walk(module, into_functions=True)):
        if n is target:
            return i
    return -1
