"""What the JAX loop rules (JX3xx) need to know about a training script.

A PyTorch step is spread over statements of a loop body: ``optimizer.zero_grad()``, a forward
pass, ``loss.backward()``, maybe a gradient clip, ``optimizer.step()``. In JAX the forward
pass becomes a function of the model (``loss_fn``) that ``nnx.value_and_grad`` differentiates
inside one ``@nnx.jit`` train step. This module finds those pieces (:func:`plan_steps`):

* the *regions* of a loop body, one per ``optimizer.step()`` (two for a GAN's D and G steps);
* for each region, the statements of the forward pass: the statements of the region's window
  that the loss depends on (a backward slice over the straight-line body) and that depend on
  a model (they call one, or read what such a statement computed). Statements that do not
  depend on a model (moving a batch, drawing noise) stay in the loop, before the step; those
  that read the forward pass but do not feed the loss (an accuracy) come after it, and what
  they read is returned by the step;
* the step's parameters: the model the optimizer trains, the optimizer, every other local the
  forward pass reads (arrays, other modules), and, as static arguments, loss objects and the
  ``args.x`` values of an argparse namespace.

Everything here reads the tree; the rule (jx301) builds the code.
"""
from __future__ import annotations

import builtins
import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from porter import astutil, localimports
from porter.astutil import code as code
from porter.context import FileContext, dotted_name
from porter.rules import module_fact

_BUILTINS = frozenset(dir(builtins))
NNX = "flax.nnx"


# --------------------------------------------------------------------------------------
# Jitted functions of a file
# --------------------------------------------------------------------------------------
JIT_DECORATORS = frozenset({"jit", "filter_jit"})  # jax.jit, nnx.jit, equinox.filter_jit


def jitted_functions(ctx: FileContext) -> frozenset:
    """Names of the file's functions (at any depth: a step defined in `main()` too) decorated
    with a jit (``@nnx.jit``, ``@jax.jit``, ``@partial(jax.jit, ...)``'s call forms
    ``@jax.jit(...)``). A module fact (porter.rules.module_fact)."""
    return module_fact(ctx, _jitted_functions_of)


def _jitted_functions_of(ctx: FileContext) -> frozenset:
    def jit(d: cst.Decorator) -> bool:
        expr = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
        return (dotted_name(expr) or "").rsplit(".", 1)[-1] in JIT_DECORATORS

    return frozenset(n.name.value for n in astutil.walk(ctx.module, into_functions=True)
                     if isinstance(n, cst.FunctionDef) and any(jit(d) for d in n.decorators))


def imports_torch(ctx: FileContext) -> bool:
    """The file imports PyTorch (an MXNet script's `loss.backward()` is not ours)."""
    return any(full == "torch" or full.startswith("torch.") for full in ctx.aliases.values())


def nnx_name(ctx: FileContext) -> str:
    return ctx.module_alias(NNX)


# --------------------------------------------------------------------------------------
# Names read and bound
# --------------------------------------------------------------------------------------
reads, binds, function_locals = astutil.reads, astutil.binds, astutil.function_locals
_params = astutil.params


def _smalls(stmt: cst.CSTNode) -> list[cst.CSTNode]:
    if isinstance(stmt, cst.SimpleStatementLine):
        return list(stmt.body)
    return []


# --------------------------------------------------------------------------------------
# Optimizers, models, loss objects
# --------------------------------------------------------------------------------------
def is_optimizer_ctor(qual: Optional[str]) -> bool:
    if not qual:
        return False
    if qual == "flax.nnx.Optimizer":
        return True
    return qual.startswith("torch.optim.") and ".lr_scheduler" not in qual and "swa_utils" not in qual


def _strip_moves(expr: cst.CSTNode) -> cst.CSTNode:
    while isinstance(expr, cst.Call) and astutil.method_name(expr) in ("to", "cuda", "cpu", "train", "eval", "float", "double"):
        expr = expr.func.value  # type: ignore[attr-defined]
    return expr


@dataclass
class FileFacts:
    optimizers: dict[str, Optional[str]] = field(default_factory=dict)  # optimizer text -> model text
    modules: set[str] = field(default_factory=set)  # names bound to module objects (models)
    losses: set[str] = field(default_factory=set)  # names bound to torch.nn.*Loss objects / functions
    namespaces: set[str] = field(default_factory=set)  # names bound to argparse results
    module_classes: set[str] = field(default_factory=set)  # classes of the file deriving from a module
    toplevel: set[str] = field(default_factory=set)  # names bound at module level
    # module-level functions of no arguments whose body only zeroes gradients
    # (`def reset_grad(): d_opt.zero_grad(); g_opt.zero_grad()`) -> the receivers they zero
    grad_resetters: dict[str, list[str]] = field(default_factory=dict)


def file_facts(ctx: FileContext) -> FileFacts:
    """The file's facts, a module fact (porter.rules.module_fact): `porter lsp` may check its
    readers one statement at a time, recording the lookups they make in it."""
    return module_fact(ctx, _file_facts_of)


# parameters whose name says they hold the model (`def evaluate(model, loader)`)
MODEL_PARAMETERS = ("model", "net", "network", "netD", "netG")


def is_model(text: str, ctx: FileContext) -> bool:
    """The expression ``text`` (at the rule's current node) holds a model of the port: a module
    the file builds (its file facts: `model = Net()`, `self.model = Net()`), or, named as a
    model is (MODEL_PARAMETERS, or ending in `model` / `net`), a parameter of the enclosing
    function or an attribute of `self` in a method (a trainer holding the model it was given)."""
    if text in file_facts(ctx).modules:
        return True
    fn = ctx.enclosing(cst.FunctionDef)
    if fn is None:
        return False
    name = text[len("self."):] if text.startswith("self.") else text
    named = name in MODEL_PARAMETERS or name.endswith(("model", "net"))
    if name is not text:
        return named and name.isidentifier() and any(p.name.value == "self" for p in _params(fn.params))
    return named and any(p.name.value == text for p in _params(fn.params))


def _file_facts_of(ctx: FileContext) -> FileFacts:
    facts = FileFacts()
    module = ctx.module
    for stmt in module.body:
        facts.toplevel.update(binds(stmt))
        zeroed = _zeroed_by(stmt)
        if zeroed:
            facts.grad_resetters[stmt.name.value] = zeroed  # type: ignore[attr-defined]
        if isinstance(stmt, cst.ClassDef):
            for base in stmt.bases:
                q = ctx.qualname(base.value) or ""
                if q in ("torch.nn.Module", "torch.nn.modules.module.Module", "flax.nnx.Module") or (
                    isinstance(base.value, cst.Name) and base.value.value in facts.module_classes
                ):
                    facts.module_classes.add(stmt.name.value)
        for small in _smalls(stmt):
            if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(getattr(small, "names", None), cst.ImportStar):
                for alias in small.names:  # type: ignore[union-attr]
                    local = alias.asname.name if alias.asname else alias.name
                    d = dotted_name(local)
                    if d:
                        facts.toplevel.add(d.split(".")[0])
    makers: Optional[dict] = None
    copies: list[tuple[str, str]] = []  # `teacher = copy.deepcopy(student)`: (copy, original)
    for node in astutil.walk(module, into_functions=True):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            target = code(node.targets[0].target)
            value = _strip_moves(node.value)
            if isinstance(value, cst.Call):
                qual = ctx.qualname(value.func) or ""
                if is_optimizer_ctor(qual):
                    facts.optimizers[target] = _optimized_model(value, qual)
                    continue
                if makers is None:
                    makers = optimizer_factories(ctx)
                built_on = _factory_model(value, makers)
                if built_on is not None:  # `optimizer = model.configure_optimizers(...)`
                    facts.optimizers[target] = built_on
                elif qual.startswith("torch.nn.") and qual.endswith("Loss"):
                    facts.losses.add(target)
                elif qual.startswith(("torch.nn.", "flax.nnx.")) and qual.split(".")[-1][:1].isupper():
                    facts.modules.add(target)
                elif isinstance(value.func, cst.Name) and value.func.value in facts.module_classes:
                    facts.modules.add(target)
                elif astutil.method_name(value) == "parse_args":
                    facts.namespaces.add(target)
                elif qual in ("functools.partial",):
                    facts.losses.add(target)
                elif qual in ("copy.deepcopy", "copy.copy") and len(value.args) == 1:
                    copies.append((target, code(value.args[0].value)))
            elif isinstance(value, cst.Lambda):
                facts.losses.add(target)
    facts.modules.update(m for m in facts.optimizers.values() if m)
    while any(original in facts.modules and target not in facts.modules for target, original in copies):
        facts.modules.update(target for target, original in copies if original in facts.modules)
    _handed_to_classes(module, facts)
    _handed_to_functions(module, facts)
    return facts


def _handed_to_functions(module: cst.Module, facts: FileFacts) -> None:
    """A function of the file given an optimizer and the model it trains under other names
    (`train_model(model_ft, criterion, optimizer_ft, ...)` calling its parameters `model` and
    `optimizer`): inside it, the parameter trains the parameter, when every call of the
    function in the file passes the same pair."""
    if not facts.optimizers:
        return
    given: dict[str, dict[str, str]] = {}  # function -> parameter -> the one text its calls give it
    for (fn, param), values in call_arguments(module).items():
        texts = {code(v) for v in values}
        if len(texts) == 1:
            given.setdefault(fn, {})[param] = texts.pop()
    for single in given.values():
        holders = {text: param for param, text in single.items()}
        for param, text in single.items():
            model = facts.optimizers.get(text)
            if model and model in holders and param not in facts.optimizers:
                facts.optimizers[param] = holders[model]
                facts.modules.add(holders[model])


def call_arguments(module: cst.Module) -> dict[tuple[str, str], list[cst.BaseExpression]]:
    """(module-level function, parameter) -> the arguments the file's calls of the function
    give the parameter (by position or keyword; none after a ``*args``/``**kwargs``)."""
    functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    out: dict[tuple[str, str], list[cst.BaseExpression]] = {}
    if not functions:
        return out
    for call in astutil.walk(module, into_functions=True):
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in functions):
            continue
        params = [p.name.value for p in astutil.params(functions[call.func.value].params)]
        for i, arg in enumerate(call.args):
            if arg.star:
                break
            name = arg.keyword.value if arg.keyword is not None else params[i] if i < len(params) else None
            if name is not None:
                out.setdefault((call.func.value, name), []).append(arg.value)
    return out


def _handed_to_classes(module: cst.Module, facts: FileFacts) -> None:
    """A trainer class given its optimizer and model (`Trainer(model, loader, optimizer)`,
    `self.optimizer = optimizer` and `self.model = model.to(gpu_id)` in its `__init__`): its
    `self.optimizer` trains its `self.model` when every construction of the class in the file
    passes an optimizer of the facts and the model that optimizer trains."""
    found: dict[tuple[int, str], set] = {}  # (class, attribute) -> the texts the constructions give it
    classes: dict[int, list[str]] = {}
    for text, cls, attr in _constructor_stores(module):
        found.setdefault((id(cls), attr), set()).add(text)
        classes.setdefault(id(cls), []).append(attr)
    for cls_id, attrs in classes.items():
        given = {attr: next(iter(found[(cls_id, attr)])) for attr in attrs if len(found[(cls_id, attr)]) == 1}
        holders = {text: attr for attr, text in given.items()}
        for attr, text in given.items():
            model = facts.optimizers.get(text)
            if model is not None and model in holders:
                facts.optimizers[attr] = holders[model]
                facts.modules.add(holders[model])


def constructor_stores(ctx: FileContext) -> list[tuple[str, cst.ClassDef, str]]:
    """(the code a construction of a top-level class of the file passes, the class,
    ``self.<attr>``) for each argument whose ``__init__`` parameter is kept as
    ``self.<attr> = <parameter>`` (``.to(device)`` moves aside; ``self.a, self.b = a, b`` too):
    ``Trainer(model, loader, optimizer, scheduler)`` -> ("scheduler", Trainer, "self.sched").
    A module fact (porter.rules.module_fact)."""
    return module_fact(ctx, _constructor_stores_of)


def _constructor_stores_of(ctx: FileContext) -> list:
    return _constructor_stores(ctx.module)


def _constructor_stores(module: cst.Module) -> list[tuple[str, cst.ClassDef, str]]:
    out = []
    for cls in module.body:
        if not isinstance(cls, cst.ClassDef):
            continue
        init = next((f for f in cls.body.body if isinstance(f, cst.FunctionDef) and f.name.value == "__init__"), None)
        if init is None:
            continue
        params = [p.name.value for p in astutil.params(init.params)][1:]
        stored: dict[str, str] = {}  # parameter -> the attribute holding it
        for node in astutil.walk(init.body):
            if isinstance(node, cst.Assign) and len(node.targets) == 1:
                for target, value in _assigned_pairs(node.targets[0].target, node.value):
                    value = _strip_moves(value)
                    if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) \
                            and target.value.value == "self" and isinstance(value, cst.Name) and value.value in params:
                        stored.setdefault(value.value, target.attr.value)
        if not stored:
            continue
        for call in astutil.walk(module, into_functions=True):
            if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == cls.name.value):
                continue
            for i, arg in enumerate(call.args):
                name = arg.keyword.value if arg.keyword is not None else params[i] if i < len(params) and not arg.star else None
                if name in stored:
                    out.append((code(arg.value), cls, f"self.{stored[name]}"))
    return out


def _assigned_pairs(target: cst.BaseExpression, value: cst.BaseExpression) -> list:
    """(target, value) pairs of an assignment: itself, or the elements of a tuple assigned a
    tuple of as many (``self.model, self.opt = model, opt``)."""
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)) \
            and len(target.elements) == len(value.elements) \
            and not any(isinstance(e, cst.StarredElement) for e in (*target.elements, *value.elements)):
        return [(t.value, v.value) for t, v in zip(target.elements, value.elements)]
    return [(target, value)]


def _zeroed_by(stmt: cst.CSTNode) -> list[str]:
    """The receivers a function of no parameters zeroes when its body is nothing but
    `x.zero_grad()` statements (a docstring aside); [] for anything else."""
    if not isinstance(stmt, cst.FunctionDef) or stmt.decorators or list(_params(stmt.params)):
        return []
    if not isinstance(stmt.body, cst.IndentedBlock):
        return []
    receivers: list[str] = []
    for line in stmt.body.body:
        if not isinstance(line, cst.SimpleStatementLine):
            return []
        for small in line.body:
            if not isinstance(small, cst.Expr):
                return []
            value = small.value
            if isinstance(value, cst.SimpleString) and not receivers:
                continue
            if astutil.method_name(value) != "zero_grad" or value.args:  # type: ignore[union-attr]
                return []
            receivers.append(code(value.func.value))  # type: ignore[union-attr]
    return receivers


def _optimized_model(call: cst.Call, qual: str) -> Optional[str]:
    first = astutil.arg(call, "params", 0)
    if qual == "flax.nnx.Optimizer":
        first = astutil.arg(call, "model", 0)
        return code(first.value) if first else None
    if first is None:
        return None
    receivers = {
        code(c.func.value)  # type: ignore[attr-defined]
        for c in astutil.calls_in(first.value)
        if astutil.method_name(c) in ("parameters", "named_parameters")
    }
    return receivers.pop() if len(receivers) == 1 else None


def _factory_model(call: cst.Call, makers: dict) -> Optional[str]:
    """The model a call of an optimizer factory builds its optimizer on: the receiver of a
    method (`model.configure_optimizers(...)`), the argument given for the parameter of a
    function (`make_optimizer(model, lr)`)."""
    if isinstance(call.func, cst.Attribute):
        if makers.get(("method", call.func.attr.value)) is None:
            return None
        receiver = _strip_moves(call.func.value)
        text = code(receiver)
        return text if dotted_name(receiver) is not None else None
    if isinstance(call.func, cst.Name):
        where = makers.get(("function", call.func.value))
        if where is None:
            return None
        index, name = where
        given = astutil.arg(call, name, index)
        if given is None or dotted_name(given.value) is None:
            return None
        return code(given.value)
    return None


def optimizer_factories(ctx: FileContext) -> dict:
    """Functions and methods that build an optimizer on a model and return it, in this file
    and in the files of the program it imports from: ("method", name) -> "self" for a method
    returning an optimizer of `self`'s parameters (`torch.optim.AdamW(groups)` whose groups
    are made of `self.named_parameters()`, or `nnx.Optimizer(self, ...)`: nanoGPT's
    `configure_optimizers`), ("function", name) -> (index, parameter) for a function
    returning an optimizer of one of its parameters (`def make_opt(net, lr): return
    SGD(net.parameters(), lr)`). Imported functions count under the name they are bound to."""
    key = ("jx.optimizer_factories",)
    if key in ctx.cache:
        return ctx.cache[key]
    out: dict = {}
    ctx.cache[key] = out  # a file importing itself sees what is known so far
    _collect_factories(ctx, ctx.module, out, imported=None)
    for module, fctx, names in _imported_modules(ctx):
        _collect_factories(fctx, module, out, imported=names)
    return out


def _imported_modules(ctx: FileContext) -> list:
    """(module, its FileContext, {name there: local name} or None for `import m`) for each
    file of the program a top-level `from m import ...` / `import m` of this file names."""
    from pathlib import Path

    from . import _program

    if not ctx.path or ctx.path.startswith("<") or not Path(ctx.path).is_file():
        return []
    folder = Path(ctx.path).resolve().parent
    out = []
    for stmt in ctx.module.body:
        for small in _smalls(stmt):
            node, names = None, None
            if isinstance(small, cst.ImportFrom):
                node = small
                if not isinstance(small.names, cst.ImportStar):
                    names = {}
                    for alias in small.names:
                        name = dotted_name(alias.name)
                        names[name] = dotted_name(alias.asname.name) if alias.asname else name
            elif isinstance(small, cst.Import):
                for alias in small.names:
                    full = dotted_name(alias.name)
                    if full:
                        node = cst.ImportFrom(module=cst.parse_expression(full), names=cst.ImportStar())
                        names = {}  # methods only: its functions are read through the module's name
            if node is None:
                continue
            path = localimports.resolve_from(node, folder)
            module = _program._parse(path) if path is not None else None
            if module is not None:
                out.append((module, FileContext(module, str(path)), names))
    return out


def _collect_factories(ctx: FileContext, module: cst.Module, out: dict, imported: Optional[dict]) -> None:
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            where = _returns_optimizer_of(stmt, ctx)
            if where is None or where[0] is None:
                continue
            local = stmt.name.value if imported is None else imported.get(stmt.name.value)
            if local is not None:
                out[("function", local)] = where
        elif isinstance(stmt, cst.ClassDef) and isinstance(stmt.body, cst.IndentedBlock):
            for item in stmt.body.body:
                if isinstance(item, cst.FunctionDef):
                    where = _returns_optimizer_of(item, ctx)
                    if where is not None and where[0] == 0:  # built on `self`
                        out[("method", item.name.value)] = "self"


def _returns_optimizer_of(fn: cst.FunctionDef, ctx: FileContext) -> Optional[tuple]:
    """(index, name) of the parameter of ``fn`` whose parameters the optimizer ``fn``
    returns is built on; None when it returns no optimizer porter can follow."""
    params = [p.name.value for p in fn.params.params]
    if not params:
        return None
    assigned: dict[str, list[cst.BaseExpression]] = {}
    returned: list[cst.BaseExpression] = []
    for n in astutil.walk(fn.body):
        if isinstance(n, cst.Assign):
            for t in n.targets:
                for name in astutil.target_names(t.target):
                    assigned.setdefault(name, []).append(n.value)
        elif isinstance(n, cst.Return) and n.value is not None:
            returned.append(n.value)
    ctors = []
    for value in returned:
        if isinstance(value, cst.Name):
            ctors.extend(assigned.get(value.value, []))
        else:
            ctors.append(value)
    owners: set[str] = set()
    for value in ctors:
        value = _strip_moves(value)
        if not isinstance(value, cst.Call) or not is_optimizer_ctor(ctx.qualname(value.func)):
            return None
        qual = ctx.qualname(value.func) or ""
        if qual == "flax.nnx.Optimizer":
            first = astutil.arg(value, "model", 0)
            owners.add(code(first.value) if first is not None else "")
            continue
        first = astutil.arg(value, "params", 0)
        if first is None:
            return None
        owners |= _parameter_owners(first.value, assigned)
    if len(owners) != 1:
        return None
    owner = owners.pop()
    return (params.index(owner), owner) if owner in params else None


def _parameter_owners(expr: cst.CSTNode, assigned: dict, depth: int = 0) -> set[str]:
    """The receivers of `.parameters()` / `.named_parameters()` calls that ``expr`` is built
    from, following the names it reads through the function's assignments (parameter
    groups: `[{"params": decay}, ...]`, `decay = [p for n, p in param_dict.items() ...]`)."""
    owners = {code(c.func.value) for c in astutil.calls_in(expr)  # type: ignore[attr-defined]
              if astutil.method_name(c) in ("parameters", "named_parameters")}
    if depth < 8:
        for name in reads(expr):
            for value in assigned.get(name, []):
                if value is not expr:
                    owners |= _parameter_owners(value, assigned, depth + 1)
    return owners


# --------------------------------------------------------------------------------------
# Statements of a loop body
# --------------------------------------------------------------------------------------
@dataclass
class Piece:
    kind: str  # "zero_grad", "backward", "step", "clip", "other"
    stmt: cst.BaseStatement
    receiver: Optional[cst.CSTNode] = None  # the optimizer / loss / model of the call
    call: Optional[cst.Call] = None


_CLIP = {
    "torch.nn.utils.clip_grad_norm_": "norm",
    "torch.nn.utils.clip_grad.clip_grad_norm_": "norm",
    "torch.nn.utils.clip_grad_value_": "value",
    "torch.nn.utils.clip_grad.clip_grad_value_": "value",
}


def classify(stmt: cst.BaseStatement, ctx: FileContext, aliases: Optional[dict] = None) -> Piece:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr):
        call = stmt.body[0].value
        if isinstance(call, cst.Call):
            m = astutil.method_name(call)
            if m == "zero_grad":
                return Piece("zero_grad", stmt, call.func.value, call)  # type: ignore[attr-defined]
            if isinstance(call.func, cst.Name) and not call.args:
                zeroed = file_facts(ctx).grad_resetters.get(call.func.value)
                if zeroed:  # reset_grad(): a helper that only zeroes gradients
                    return Piece("zero_grad", stmt, cst.parse_expression(zeroed[0]), call)
            if m == "backward" and not call.args:
                return Piece("backward", stmt, call.func.value, call)  # type: ignore[attr-defined]
            if m == "step" and not call.args:
                receiver = call.func.value  # type: ignore[attr-defined]
                text = code(receiver)
                if (aliases or {}).get(text, text) in file_facts(ctx).optimizers:
                    return Piece("step", stmt, receiver, call)
            if (ctx.qualname(call.func) or "") in _CLIP:
                return Piece("clip", stmt, None, call)
    return Piece("other", stmt)


def has_backward(node: cst.CSTNode, into_functions: bool = False) -> bool:
    """``node`` calls ``.backward()`` (also in the functions defined in it, ``into_functions``:
    a loop body's ``def _backward(loss): loss.backward()``)."""
    return any(isinstance(n, cst.Call) and astutil.method_name(n) == "backward"
               for n in astutil.walk(node, into_functions=into_functions))


@dataclass
class Region:
    optimizer: str  # the optimizer's name in the loop
    model: Optional[str]  # the model it trains
    losses: list[cst.CSTNode]  # receivers of .backward()
    forward: list[cst.BaseStatement]  # statements of loss_fn, in order
    before: list[cst.BaseStatement]  # stay in the loop before the step call
    after: list[cst.BaseStatement]  # stay in the loop after the step call
    clips: list[Piece]
    dropped: list[cst.BaseStatement]  # zero_grad / backward / step / clip statements
    recomputed: list[cst.BaseStatement]  # forward statements of an earlier region computed again
    outputs: list[str] = field(default_factory=list)  # names the loop reads after the step
    first: Optional[cst.BaseStatement] = None  # the first statement of the window (comments)


@dataclass
class Plan:
    regions: list[Region]
    tail: list[cst.BaseStatement]  # the statements after the last step


class Unsupported(Exception):
    """The loop trains, but not in a form the rewrite handles; the message says why."""


def plan_steps(loop: cst.For | cst.While, ctx: FileContext, later_reads: set[str],
               aliases: Optional[dict] = None) -> Plan:
    """Split the loop body into step regions. ``later_reads``: names read anywhere in the
    enclosing scope outside this loop body (after the loop, a ``return``)."""
    body = loop.body
    if not isinstance(body, cst.IndentedBlock):
        raise Unsupported("the loop body is on one line")
    stmts = list(body.body)
    aliases = aliases or {}  # `model` -> "self.model" in a method (see SelfAliases)
    back = {v: k for k, v in aliases.items()}
    pieces = [classify(s, ctx, aliases) for s in stmts]
    for p in pieces:
        if p.kind == "other" and has_backward(p.stmt):
            raise Unsupported("loss.backward() is nested in a block of the loop body")
    steps = [i for i, p in enumerate(pieces) if p.kind == "step"]
    if not steps:
        raise Unsupported("no optimizer.step() in the loop body next to loss.backward()")
    facts = file_facts(ctx)
    taken = bound_in(stmts) | set(reads(body)) | set(later_reads)
    rewritten: set[int] = set()  # statements of the body the regions hold rewritten (_capture_rebound)
    body_ids = {id(s) for s in stmts}
    regions: list[Region] = []
    start = 0
    earlier_forward: list[cst.BaseStatement] = []
    for end in steps:
        window = pieces[start:end + 1]
        backs = [p for p in window if p.kind == "backward"]
        if not backs:
            raise Unsupported(f"{code(pieces[end].receiver)}.step() has no loss.backward() before it")
        last_back = max(i for i, p in enumerate(window) if p.kind == "backward")
        between = []  # statements between the backward pass and the step: they run after the step
        for p in window[last_back + 1:-1]:
            if p.kind in ("clip", "zero_grad"):
                continue
            text = code(p.stmt)
            if p.kind != "other" or ".grad" in text or "parameters()" in text or not isinstance(p.stmt, cst.SimpleStatementLine):
                raise Unsupported(f"`{text.strip()}` runs between loss.backward() and optimizer.step()")
            between.append(p.stmt)
        opt_text = code(pieces[end].receiver)
        if not isinstance(pieces[end].receiver, cst.Name):
            raise Unsupported(f"the optimizer {opt_text} is not a plain name")
        model = facts.optimizers.get(aliases.get(opt_text, opt_text))
        model = back.get(model, model) if model else model
        zero = [p for p in window if p.kind == "zero_grad"]
        if model is None:
            for z in zero:
                if code(z.receiver) != opt_text:
                    model = code(z.receiver)
        if model is None or not model.isidentifier():
            raise Unsupported(f"porter cannot tell which model {opt_text} trains")
        models = facts.modules | {model} | {k for k, v in aliases.items() if v in facts.modules}
        # candidate statements: everything of the body before the last backward of the window
        domain = [p.stmt for p in pieces[:start + last_back] if p.kind == "other"]
        in_window = {id(p.stmt) for p in window if p.kind == "other"}
        earlier_ids = {id(s) for s in earlier_forward}
        loss_reads: set[str] = set()
        for b in backs:
            loss_reads.update(reads(b.receiver))
        for c in window:
            if c.kind == "clip":
                loss_reads.update(reads(c.call))
        slice_ids = _backward_slice(domain, loss_reads)
        dep_ids = _model_dependent(domain, models, ctx)
        forward, before, after, recomputed = [], [], [], []
        for s in domain:
            sid = id(s)
            if sid in in_window:
                if _sets_model_attributes(s, models):
                    before.append(s)  # a flag on the model (`model.require_backward_grad_sync = ...`)
                elif sid in slice_ids and sid in dep_ids:
                    forward.append(s)
                elif sid in dep_ids:
                    after.append(s)
                else:
                    before.append(s)
            elif sid in earlier_ids and sid in slice_ids and sid in dep_ids and not _read_detached(
                    [d for d in domain if id(d) in in_window], binds(s)):
                # a model's output an earlier step computed (the generator's `fake` in the
                # discriminator's step) is computed again where this model's gradient flows
                # through it; a value computed from no model, or read here only detached
                # (`D(fake.detach())`), comes out of the earlier step
                forward.append(s)
                recomputed.append(s)
        # a write of the optimizer's own state (its rate: `optimizer.opt_state.hyperparams[
        # "learning_rate"][...] = lr`, JX202's form of a param_groups write) that reads nothing
        # the step computes is for this step: it runs before the step call, as before step()
        window_binds = set().union(*(binds(p.stmt) for p in window[:last_back + 1]))
        for_step = [st for st in between if _writes_through(st, opt_text) and not set(reads(st)) & window_binds]
        between = [st for st in between if st not in for_step]
        if between:
            called_models = {n for st in between for n in reads(st) if n in models}
            if called_models:
                raise Unsupported(f"`{code(between[0]).strip()}` uses {', '.join(sorted(called_models))} between loss.backward() and optimizer.step()")
            after.extend(between)
        forward, after = _pull_aliases(domain, forward, after, in_window)
        forward, before = _pull_rebinding_inputs(domain, forward, before, slice_ids, ctx)
        kept_ids = {id(x) for x in after}
        forward, after = _capture_rebound(domain, forward, after, taken)
        rewritten |= kept_ids - {id(x) for x in after}
        before, after = _defer_prefetch(domain, forward, before, after, slice_ids)
        _check_order(domain, forward, before, after)
        before.extend(for_step)
        for s in forward:
            text = code(s)
            if ".item()" in text or "print(" in text:
                raise Unsupported(f"`{text.strip()}` reads a value on the host inside the step")
            per_iteration = bound_in(stmts) | set(astutil.target_names(loop.target) if isinstance(loop, cst.For) else ())
            if isinstance(s, cst.If) and not (set(if_test_reads(s)) & (per_iteration | models)):
                continue  # a branch on the script's settings (`if kind == "softmax":`): static in the step
            if not isinstance(s, cst.SimpleStatementLine):
                raise Unsupported(f"a compound statement is part of the forward pass: `{text.strip().splitlines()[0]}`")
        regions.append(Region(
            opt_text, model, [b.receiver for b in backs], forward, before, after,
            [p for p in window if p.kind == "clip"],
            [p.stmt for p in window if p.kind != "other"], recomputed,
            first=window[0].stmt,
        ))
        earlier_forward.extend(forward)
        start = end + 1
    tail = [p.stmt for p in pieces[start:] if p.kind != "zero_grad"]  # zero_grad() after the step goes too
    for p in pieces[start:]:
        if p.kind not in ("other", "zero_grad"):
            raise Unsupported(f"`{code(p.stmt).strip()}` after the last optimizer.step()")
    # what each region's step returns: names its forward binds that anything else reads
    for k, region in enumerate(regions):
        bound: set[str] = set()
        for s in region.forward:
            bound |= binds(s)
        readers: set[str] = set(later_reads)
        in_steps = {id(x) for r in regions for x in r.forward} | {id(d) for r in regions for d in r.dropped}
        for other in stmts:
            if id(other) not in in_steps and id(other) not in rewritten:
                readers.update(reads(other))
        for r in regions:
            if r is not region:
                readers.update(free_reads(r.forward))
            for other in r.after:
                if id(other) not in body_ids:  # rewritten (_capture_rebound)
                    readers.update(reads(other))
        # read before being rebound: the next iteration reads it (a recurrent state)
        readers.update(free_reads(region.forward))
        # the model itself is no output: what the forward stores on it (`model.hidden =
        # model.init_hidden()`) is module state, which NNX carries out of the step
        region.outputs = [n for n in _ordered_binds(region.forward) if n in readers and n != region.model]
    return Plan(regions, tail)


# what makes a model's second forward pass differ from its first, in torch's spellings and
# the port's: layers that update running statistics or draw (anywhere in its code), random
# draws (outside its constructor, where they initialise weights)
_STATEFUL_LAYERS = ("BatchNorm", "InstanceNorm", "Dropout", "dropout", "running_", "RReLU")
_DRAWS = ("rand", "bernoulli", "multinomial", "normal_", "uniform_", "Rngs(", "rngs.")
_KNOWN_CODE = ("torch.", "flax.", "jax.", "optax.", "math.", "numpy.", "functools.")


def _read_detached(stmts: list[cst.BaseStatement], names: set[str]) -> bool:
    """Every read of ``names`` in ``stmts`` is detached from the graph: `x.detach()`,
    `jax.lax.stop_gradient(x)` (no gradient flows into what computed it); at least one is."""
    seen = False
    for stmt in stmts:
        detached: set[int] = set()
        not_reads: set[int] = set()  # attribute and keyword names, assignment targets
        for n in astutil.walk(stmt):
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute):
                if n.func.attr.value == "detach" and not n.args and isinstance(n.func.value, cst.Name):
                    detached.add(id(n.func.value))
                elif code(n.func) in ("jax.lax.stop_gradient", "lax.stop_gradient") and len(n.args) == 1 \
                        and isinstance(n.args[0].value, cst.Name):
                    detached.add(id(n.args[0].value))
            if isinstance(n, cst.Attribute):
                not_reads.add(id(n.attr))
            elif isinstance(n, cst.Arg) and n.keyword is not None:
                not_reads.add(id(n.keyword))
            elif isinstance(n, cst.AssignTarget):
                not_reads.add(id(n.target))
        for n in astutil.walk(stmt):
            if isinstance(n, cst.Name) and n.value in names and id(n) not in not_reads:
                if id(n) not in detached:
                    return False
                seen = True
    return seen


def recompute_exact(stmt: cst.BaseStatement, ctx: FileContext, updated: frozenset = frozenset()) -> bool:
    """Computing ``stmt`` (a forward statement of an earlier step) again in a later step gives
    what the original's one computation gave and has no other effect: it calls no model an
    earlier step ``updated``, every model it calls is built by code of this file (its classes
    and functions, torch's and flax's layers) and none of that code updates running
    statistics or draws random numbers after construction. A model of imported code, or one
    with BatchNorm or dropout, is not known to be."""
    facts = file_facts(ctx)
    if set(reads(stmt)) & updated:
        return False
    defs = {d.name.value: d for d in ctx.module.body if isinstance(d, (cst.ClassDef, cst.FunctionDef))}

    def clean(node: cst.CSTNode, in_init: bool) -> bool:
        text = code(node)
        return not any(w in text for w in _STATEFUL_LAYERS) and (in_init or not any(w in text for w in _DRAWS))

    if not clean(stmt, False):
        return False
    todo: list[tuple[cst.CSTNode, bool]] = []
    for name in reads(stmt):
        if name in facts.modules:
            values = astutil.assigned_values(ctx.module, name)
            if not values or any(v is None for v in values):
                return False
            todo.extend((v, True) for v in values)
    seen: set[str] = set()
    while todo:
        node, in_init = todo.pop()
        if isinstance(node, cst.ClassDef):
            for item in node.body.body:
                init = isinstance(item, cst.FunctionDef) and item.name.value == "__init__"
                todo.append((item, init))
            continue
        if not clean(node, in_init):
            return False
        for call in astutil.calls_in(node):
            func = call.func
            if isinstance(func, cst.Name) and func.value in defs:
                if func.value not in seen:
                    seen.add(func.value)
                    todo.append((defs[func.value], in_init))
                continue
            qual = ctx.qualname(func)
            if isinstance(func, cst.Name) and (func.value in _BUILTINS and qual is None or func.value in facts.modules):
                continue
            if qual is not None and not qual.startswith(_KNOWN_CODE):
                return False  # imported code: porter does not see what it does
            if qual is None and isinstance(func, cst.Name):
                return False
    return True


def _writes_through(stmt: cst.BaseStatement, name: str) -> bool:
    """``stmt`` is one assignment to an attribute or item of ``name`` (`optimizer.x[...] = v`)."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return False
    small = stmt.body[0]
    targets = ([t.target for t in small.targets] if isinstance(small, cst.Assign)
               else [small.target] if isinstance(small, (cst.AugAssign, cst.AnnAssign)) else [])
    return bool(targets) and all(isinstance(t, (cst.Attribute, cst.Subscript)) and root_name(t) == name
                                 for t in targets)


def _sets_model_attributes(stmt: cst.BaseStatement, models: set[str]) -> bool:
    """``stmt`` only assigns attributes of models (`model.require_backward_grad_sync = ...`,
    under an `if` on the settings or not) and calls none: a flag for the framework, not a
    statement of the forward pass."""
    stores = 0
    for n in astutil.walk(stmt):
        if isinstance(n, cst.Call):
            if models & set(reads(n.func)):
                return False
        elif isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in n.targets] if isinstance(n, cst.Assign) else [n.target]
            for t in targets:
                if not isinstance(t, cst.Attribute) or root_name(t) not in models:
                    return False
                stores += 1
        elif isinstance(n, (cst.For, cst.While, cst.With, cst.FunctionDef, cst.ClassDef, cst.Return)):
            return False
    return stores > 0


def _pull_aliases(domain, forward, after, in_window):
    """A plain copy of a forward value that a later forward statement rebinds (`real_score =
    outputs` before `outputs = D(fake)`) is computed inside the step, where it reads the
    value it reads in torch, and returned from it; left after the step call it would read
    the rebound value. Only assignments to names of an expression with no call move: they
    have no effect but their binding."""
    position = {id(s): i for i, s in enumerate(domain)}
    pulled = []
    for s in after:
        if id(s) not in in_window or not _plain_alias(s):
            continue
        at = position.get(id(s))
        if at is None:  # between the last backward and the step: no forward statement follows it
            continue
        names = set(reads(s))
        if any(position.get(id(f), -1) > at and binds(f) & names for f in forward):
            pulled.append(s)
    if not pulled:
        return forward, after
    ids = {id(s) for s in [*forward, *pulled]}
    in_domain = [s for s in domain if id(s) in ids]
    rest = [s for s in forward if id(s) not in position]  # none today; kept in order if any
    return in_domain + rest, [s for s in after if s not in pulled]


def _defer_prefetch(domain, forward, before, after, slice_ids):
    """A statement that needs no model and rebinds what an earlier forward statement read
    (`X, Y = get_batch('train')` after `logits, loss = model(X, Y)`: the next batch fetched
    while the device computes) runs after the step call, with the statements before the
    call that read what it binds; the step reads the batch torch's forward pass read."""
    position = {id(s): i for i, s in enumerate(domain)}
    moved: list = []
    moved_binds: set[str] = set()
    for s in before:
        at = position[id(s)]
        bound = binds(s)
        earlier_reads = {n for f in forward if position.get(id(f), len(domain)) < at for n in reads(f)}
        if id(s) not in slice_ids and (bound & earlier_reads or moved_binds & set(reads(s))):
            moved.append(s)
            moved_binds |= bound
    if not moved:
        return before, after
    ids = {id(s) for s in moved}
    later = sorted([*after, *moved], key=lambda s: position.get(id(s), len(domain)))
    return [s for s in before if id(s) not in ids], later


def _pull_rebinding_inputs(domain, forward, before, slice_ids, ctx: FileContext):
    """A statement the loss needs, that needs no model but rebinds what an earlier forward
    statement read (`label = jnp.full_like(label, 0.0)` between a GAN's real and fake
    batches: torch's `label.fill_(fake_label)`), is computed inside the step, in its place
    between the two forward passes; before the step call both passes would read the rebound
    value. Only array code moves: no host read, no host random draw, no call of the script's
    own functions."""
    position = {id(s): i for i, s in enumerate(domain)}
    fwd = [(position[id(f)], f) for f in forward if id(f) in position]
    moved = []
    for s in before:
        at = position.get(id(s))
        if at is None or id(s) not in slice_ids or not _traceable(s, ctx):
            continue
        bound = binds(s)
        if any(i < at and bound & set(reads(f)) for i, f in fwd):
            moved.append(s)
    if not moved:
        return forward, before
    ids = {id(s) for s in moved}
    merged = sorted([*forward, *moved], key=lambda s: position.get(id(s), len(domain)))
    return merged, [s for s in before if id(s) not in ids]


_HOST_METHODS = frozenset({"item", "tolist", "numpy", "cpu", "__next__"})


def _traceable(stmt: cst.BaseStatement, ctx: FileContext) -> bool:
    """``stmt`` is one line of array code that can run inside a jitted step: its calls are
    JAX functions and array methods, none that reads a value on the host."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    for call in astutil.calls_in(stmt):
        qual = ctx.qualname(call.func) or ""
        if qual.split(".")[0] in ("jax", "optax", "flax"):
            continue
        if isinstance(call.func, cst.Attribute) and not qual and call.func.attr.value not in _HOST_METHODS:
            continue  # a method of an array (`x.reshape(-1)`)
        return False
    return True


def _capture_rebound(domain, forward, after, taken: set[str]):
    """A statement after the step that reads a forward value a later forward statement
    rebinds (`d_real = out.mean().item()` between `out = D(real)` and `out = D(fake)`): the
    step keeps the first value under a name of its own (`out_1 = out`, returned from the
    step) and the statement reads that name."""
    position = {id(s): i for i, s in enumerate(domain)}
    fwd = [(position[id(f)], f) for f in forward if id(f) in position]
    forward = list(forward)
    new_after = []
    for s in after:
        at = position.get(id(s))
        renames: dict[str, str] = {}
        for n in ([] if at is None else reads(s)):
            if n in binds(s) or not any(i > at and n in binds(f) for i, f in fwd):
                continue
            sources = [f for i, f in fwd if i < at and n in binds(f)]
            if not sources:
                continue  # bound before the window: _check_order reports it
            alias = n + "_1"
            k = 1
            while alias in taken:
                k += 1
                alias = f"{n}_{k}"
            taken.add(alias)
            forward.insert(forward.index(sources[-1]) + 1, cst.parse_statement(f"{alias} = {n}\n"))
            renames[n] = alias
        new_after.append(s.visit(RenameReads(renames)) if renames else s)
    return forward, new_after


def _plain_alias(stmt: cst.BaseStatement) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    if not isinstance(small, cst.Assign):
        return False
    if not all(isinstance(t.target, (cst.Name, cst.Tuple)) and all(
            isinstance(e.value, cst.Name) for e in getattr(t.target, "elements", [])) for t in small.targets):
        return False
    return not any(isinstance(n, (cst.Call, cst.Await, cst.Yield, cst.NamedExpr)) for n in astutil.walk(small.value))


def _check_order(domain, forward, before, after) -> None:
    """Moving statements around the step call must not change what they read: a statement
    that runs after the call must not read a name a later forward statement rebinds, and one
    that runs before it must not rebind a name an earlier forward statement read."""
    position = {id(s): i for i, s in enumerate(domain)}
    fwd = [(position[id(s)], s) for s in forward if id(s) in position]
    for s in after:
        at = position.get(id(s), len(domain))
        names = set(reads(s))
        for i, f in fwd:
            if i > at and binds(f) & names:
                raise Unsupported(f"`{code(s).strip()}` reads {', '.join(sorted(binds(f) & names))} before the forward pass rebinds it")
    for s in before:
        at = position[id(s)]
        bound = binds(s)
        for i, f in fwd:
            if i < at and bound & set(reads(f)):
                raise Unsupported(f"`{code(s).strip()}` rebinds {', '.join(sorted(bound & set(reads(f))))} after the forward pass read it")


def free_reads(stmts: list[cst.BaseStatement]) -> list[str]:
    """Names the statements read before they bind them, in order."""
    bound: set[str] = set()
    free: dict[str, None] = {}
    for s in stmts:
        for n in reads(s):
            if n not in bound:
                free[n] = None
        bound |= binds(s)
    return list(free)


def _ordered_binds(stmts: list[cst.BaseStatement]) -> list[str]:
    out: dict[str, None] = {}
    for s in stmts:
        for small in _smalls(s):
            targets = []
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
            elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                targets = [small.target]
            for t in targets:
                for n in astutil.target_names(t):
                    out[n] = None
        for n in sorted(binds(s)):  # an `if`'s blocks, an in-place update (`label.fill_(0)`)
            out[n] = None
    return list(out)


def if_test_reads(stmt: cst.If) -> list[str]:
    """Names the tests of an if / elif chain read."""
    out: dict[str, None] = {}
    node = stmt
    while isinstance(node, cst.If):
        out.update(dict.fromkeys(reads(node.test)))
        node = node.orelse
    return list(out)


def bound_in(stmts) -> set[str]:
    out: set[str] = set()
    for s in stmts:
        out |= binds(s)
    return out


def _backward_slice(domain: list[cst.BaseStatement], needed: set[str]) -> set[int]:
    needed = set(needed)
    found: set[int] = set()
    for s in reversed(domain):
        b = binds(s)
        if b & needed:
            found.add(id(s))
            needed -= {n for n in b if not _reads_itself(s, n)}
            needed.update(reads(s))
    return found


def _reads_itself(stmt: cst.BaseStatement, name: str) -> bool:
    return name in reads(stmt)


def _model_dependent(domain: list[cst.BaseStatement], models: set[str], ctx: FileContext) -> set[int]:
    tainted: set[str] = set()
    found: set[int] = set()
    for s in domain:
        mode_switch = isinstance(s, cst.SimpleStatementLine) and all(
            isinstance(x, cst.Expr) and astutil.method_name(x.value) in ("train", "eval", "zero_grad") for x in s.body)
        # calls a model, a method of one, or passes one to a function (loss = compute_loss(model, batch))
        calls_model = not mode_switch and bool(models & set(reads(s)))
        if calls_model or tainted & set(reads(s)):
            found.add(id(s))
            tainted |= binds(s)
    return found


# --------------------------------------------------------------------------------------
# Small shared pieces of the other loop rules
# --------------------------------------------------------------------------------------
MANUAL = astutil.MANUAL


# a marker at the end of a simple statement's line or on a comment line above any statement
# (the loop rules mark a loop on the line above it; a header line does not count)
has_manual_marker = functools.partial(astutil.has_manual_marker, header=False, leading_lines=True)


with_manual_comment = astutil.with_manual_comment  # (stmt, code, reason): `# porter: manual (CODE): reason`


DEVICE_WORDS = ("device", "dev")
# calls that make a torch device (torch.accelerator's is CUDA's on a CUDA build of torch)
DEVICE_CALLS = ("torch.device", "torch.accelerator.current_accelerator")
# names of a CUDA device number: `.to(gpu_id)`, `.to(self.local_rank)` (an int given to .to()
# is a CUDA device; a dtype is never spelled so)
ORDINAL_WORDS = ("gpu", "gpu_id", "device_id", "device_idx", "local_rank", "rank", "cuda_id")


def is_device_expr(expr: cst.CSTNode, ctx: FileContext) -> bool:
    """``device``, ``args.device``, ``self.device``, ``x.device``, ``"cuda"``, ``"cuda:0"``,
    ``"cpu"``, ``torch.device(...)``, and device numbers: ``0``, ``gpu_id``, ``args.local_rank``."""
    if isinstance(expr, cst.SimpleString):
        value = astutil.string_value(expr) or ""
        return value.split(":")[0] in ("cuda", "cpu")
    if isinstance(expr, cst.Integer):
        return True
    if isinstance(expr, cst.Call):
        return ctx.qualname(expr.func) in DEVICE_CALLS
    name = dotted_name(expr)
    if name is None:
        return False
    last = name.split(".")[-1].lower()
    return last in DEVICE_WORDS or last.endswith("device") or last in ORDINAL_WORDS


def device_move(call: cst.CSTNode, ctx: FileContext) -> Optional[cst.CSTNode]:
    """For ``x.to(device[, non_blocking=..])`` / ``x.cuda(...)``: the receiver ``x``."""
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
        return None
    m = call.func.attr.value
    if m == "cuda":
        if all(a.keyword is None or a.keyword.value in ("non_blocking", "device") for a in call.args):
            return call.func.value
        return None
    if m != "to" or not call.args:
        return None
    device = astutil.arg(call, "device", 0)
    if device is None or not is_device_expr(device.value, ctx):
        return None
    for a in call.args:
        if a is not device and not (a.keyword is not None and a.keyword.value in ("non_blocking", "copy")):
            return None
    return call.func.value


# calls a JAX port drops with their statement: CUDA's own RNG and cache (JAX has neither)
CUDA_ONLY_CALLS = frozenset({
    "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.cuda.empty_cache", "torch.cuda.set_device",
    "torch.cuda.reset_peak_memory_stats", "torch.cuda.ipc_collect",
    "torch.accelerator.empty_cache", "torch.accelerator.set_device_index", "torch.accelerator.set_device_idx",
    "torch.accelerator.reset_peak_memory_stats",
})
CUDA_SWITCH_PREFIXES = ("torch.backends.cudnn.", "torch.backends.cuda.matmul.", "torch.backends.cuda.")
# calls a condition may make and still be dropped with its `if`: what they answer is all they do
_QUERY_CALLS = frozenset({
    "torch.cuda.is_available", "torch.cuda.device_count", "torch.backends.mps.is_available",
    "torch.backends.mps.is_built", "torch.accelerator.is_available", "torch.cuda.is_bf16_supported",
    "torch.accelerator.device_count",
})


def availability_flag(expr: cst.CSTNode, ctx: FileContext) -> bool:
    """``torch.cuda.is_available()``, ``not args.no_cuda and torch.cuda.is_available()``,
    ``torch.cuda.device_count() > 1``: a value that only asks whether CUDA (or MPS) is there,
    from names, attributes and CUDA's availability queries. A JAX port has no CUDA to ask about."""
    return _no_calls(expr, ctx, _QUERY_CALLS) and any(
        isinstance(n, cst.Call) for n in astutil.walk(expr, into_functions=True))


def _no_calls(expr: cst.CSTNode, ctx: FileContext, allowed: frozenset = frozenset()) -> bool:
    return not any(
        (isinstance(n, cst.Call) and ctx.qualname(n.func) not in allowed)
        or isinstance(n, (cst.Yield, cst.Await, cst.NamedExpr))
        for n in astutil.walk(expr, into_functions=True)
    )


def _moves_itself(target: cst.CSTNode, value: cst.CSTNode, ctx: FileContext) -> bool:
    """``x = x.cuda()`` / ``model = model.to(device)``: a name given its own device move."""
    receiver = device_move(value, ctx)
    return receiver is not None and isinstance(receiver, (cst.Name, cst.Attribute)) and code(receiver) == code(target)


_DATA_PARALLEL = ("torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                  "torch.nn.parallel.data_parallel.DataParallel")


def data_parallel_wrap(small: cst.CSTNode, ctx: FileContext) -> bool:
    """``model = nn.DataParallel(model[, device_ids=...])``: the same module, its batches split
    over the local GPUs (the port's jitted step runs on JAX's default device)."""
    if not isinstance(small, cst.Assign) or len(small.targets) != 1 or not isinstance(small.value, cst.Call):
        return False
    call = small.value
    if ctx.qualname(call.func) not in _DATA_PARALLEL or not call.args or call.args[0].keyword is not None:
        return False
    return code(call.args[0].value) == code(small.targets[0].target) and all(
        _no_calls(a.value, ctx, _QUERY_CALLS) for a in call.args[1:])


def places(node: cst.CSTNode, ctx: FileContext) -> bool:
    """A device move or a DataParallel wrap somewhere in ``node``."""
    return any(device_move(n, ctx) is not None or data_parallel_wrap(n, ctx) for n in astutil.walk(node))


def placement_only(small: cst.CSTNode, ctx: FileContext) -> bool:
    """A small statement whose whole effect is device placement or CUDA's own state, which the
    JAX port drops (its batches become NumPy arrays where the loop body begins): `net.cuda()`,
    `x = x.to(device)`, `x, y = x.cuda(), y.cuda()`, `model = nn.DataParallel(model)`,
    `torch.cuda.manual_seed(s)`, `torch.backends.cudnn.benchmark = True`."""
    if isinstance(small, cst.Expr):
        value = small.value
        receiver = device_move(value, ctx)
        if receiver is not None:
            return isinstance(receiver, (cst.Name, cst.Attribute))
        return (isinstance(value, cst.Call) and ctx.qualname(value.func) in CUDA_ONLY_CALLS
                and all(_no_calls(a.value, ctx) for a in value.args))
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return False
    if data_parallel_wrap(small, ctx):
        return True
    target, value = small.targets[0].target, small.value
    if (ctx.qualname(target) or "").startswith(CUDA_SWITCH_PREFIXES):
        return _no_calls(value, ctx)
    if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and len(target.elements) == len(value.elements):
        return all(not isinstance(e, cst.StarredElement) and not isinstance(v, cst.StarredElement)
                   and _moves_itself(e.value, v.value, ctx) for e, v in zip(target.elements, value.elements))
    return _moves_itself(target, value, ctx)


def _block_placement_only(block: cst.BaseSuite, ctx: FileContext) -> bool:
    statements = block.body if isinstance(block, cst.IndentedBlock) else [block]
    return bool(statements) and all(
        isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite))
        and all(isinstance(small, cst.Pass) or placement_only(small, ctx) for small in stmt.body)
        for stmt in statements
    )


def placement_if(node: cst.CSTNode, ctx: FileContext) -> bool:
    """``if use_cuda: model.cuda()`` / ``if args.cuda: x, y = x.cuda(), y.cuda()`` (an ``else`` of
    the same kind allowed, no ``elif``): an ``if`` whose every branch only places on a device,
    under a condition that only reads (names, attributes, comparisons, CUDA's availability
    queries). The JAX port has nothing left to do in it: the whole statement goes."""
    if not isinstance(node, cst.If) or isinstance(node.orelse, cst.If):
        return False
    if not _no_calls(node.test, ctx, _QUERY_CALLS) or not _block_placement_only(node.body, ctx):
        return False
    if node.orelse is not None and not _block_placement_only(node.orelse.body, ctx):
        return False
    return any(placement_only(n, ctx) for n in astutil.walk(node) if isinstance(n, cst.BaseSmallStatement))


def in_placement_if(ctx: FileContext) -> bool:
    """The current node lies in a `placement_if` (which goes whole)."""
    return any(placement_if(anc, ctx) for anc in ctx.ancestors[:-1] if isinstance(anc, cst.If))


def loop_targets(ctx: FileContext) -> set[str]:
    """Names bound by the targets of the for loops around the current node (in its function)."""
    names: set[str] = set()
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, cst.For):
            names.update(astutil.target_names(anc.target))
        if isinstance(anc, (cst.FunctionDef, cst.ClassDef)):
            break
    return names


def strip_iter(node: cst.CSTNode) -> cst.CSTNode:
    """The iterable under ``enumerate(...)`` / ``tqdm(...)`` / ``iter(...)`` wrappers."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ("enumerate", "tqdm", "iter") \
            and node.args:
        node = node.args[0].value
    return node


def loader_names(ctx: FileContext) -> set[str]:
    """Names (or attribute chains) the file binds to a torch ``DataLoader(...)``."""
    key = ("jx.loader_names",)
    if key in ctx.cache:
        return ctx.cache[key]
    out: set[str] = set()

    def is_loader(value: cst.BaseExpression) -> bool:
        qual = ctx.qualname(value.func) or "" if isinstance(value, cst.Call) else ""
        return qual.startswith("torch.utils.data") and qual.endswith("DataLoader")

    for n in astutil.walk(ctx.module, into_functions=True):
        if isinstance(n, cst.Assign):
            if is_loader(n.value):
                out |= {code(t.target) for t in n.targets}
            elif (isinstance(n.value, cst.DictComp) and is_loader(n.value.value)) or (
                    isinstance(n.value, cst.Dict) and n.value.elements
                    and all(isinstance(e, cst.DictElement) and is_loader(e.value) for e in n.value.elements)):
                # `loaders = {phase: DataLoader(...) for phase in ...}`: `loaders[phase]` is one
                out |= {code(t.target) + "[]" for t in n.targets}
    out |= _loader_parameters(ctx.module, out)
    ctx.cache[key] = out
    return out


def _loader_parameters(module: cst.Module, loaders: set[str]) -> set[str]:
    """Parameters of the file's functions that every call of the function in the file gives a
    DataLoader (``run_epoch(model, loaders["train"])`` for ``def run_epoch(net, loader)``)."""
    if not loaders:
        return set()
    return {param for (_fn, param), values in call_arguments(module).items()
            if all(_loader_text(v) in loaders for v in values)}


def _loader_text(expr: cst.BaseExpression) -> str:
    """How loader_names spells ``expr``: its code, ``loaders[]`` for an item of a dict."""
    return code(expr.value) + "[]" if isinstance(expr, cst.Subscript) else code(expr)


def is_loader_expr(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """``expr`` is a torch DataLoader of the file: a name bound to one, or an item of a dict
    of them (``loaders[phase]``)."""
    return _loader_text(expr) in loader_names(ctx)


def loader_batch_target(loop: cst.For, ctx: FileContext) -> Optional[cst.BaseAssignTargetExpression]:
    """The part of a for loop's target that is the batch of a torch DataLoader
    (``(x, y)`` of ``for i, (x, y) in enumerate(loader)``), or None."""
    if not is_loader_expr(strip_iter(loop.iter), ctx):
        return None
    target = loop.target
    it = loop.iter
    while isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value in ("enumerate", "tqdm", "iter"):
        if it.func.value == "enumerate":
            if not isinstance(target, (cst.Tuple, cst.List)) or len(target.elements) != 2:
                return None
            target = target.elements[1].value
        it = it.args[0].value
    return target


# --------------------------------------------------------------------------------------
# Batches that are no for loop's target: `x, y = next(iter(loader))`, `batch = next(it)` in
# a while loop, `x, y = batch`, a function's parameter given a loader's batch
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchBinding:
    """A statement binding names to a torch DataLoader's batch, outside a for loop's target."""

    stmt: cst.SimpleStatementLine  # `x, y = next(iter(loader))`, `batch = next(it)`, `x, y = batch`
    names: tuple  # the names it binds (one: the whole batch)
    scope: cst.CSTNode  # the function (or module) whose names they are
    handed: bool = False  # the unpacking of a parameter that a caller gives a batch (np.asarray)


@dataclass
class BatchFacts:
    bindings: dict = field(default_factory=dict)  # id(statement) -> BatchBinding
    # (id(scope), name) of a single batch name handed to a function of the file that unpacks it
    handed_over: set = field(default_factory=set)
    names: dict = field(default_factory=dict)  # id(scope) -> names bound to batches or their parts there


def batch_facts(ctx: FileContext) -> BatchFacts:
    return module_fact(ctx, _batch_facts_of)


def _scopes(module: cst.Module):
    """(scope, the statements of it, not entering nested functions) for the module and every function."""
    yield module, module
    for n in astutil.walk(module, into_functions=True):
        if isinstance(n, cst.FunctionDef):
            yield n, n.body


def _single_assign(stmt: cst.CSTNode) -> Optional[cst.Assign]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign) \
            and len(stmt.body[0].targets) == 1:
        return stmt.body[0]
    return None


def _target_names(target: cst.CSTNode) -> Optional[tuple]:
    """``x`` -> ("x",); ``x, y`` / ``(x, y)`` / ``[x, y]`` -> ("x", "y"); None for anything else."""
    if isinstance(target, cst.Name):
        return (target.value,)
    if isinstance(target, (cst.Tuple, cst.List)) and target.elements \
            and all(isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in target.elements):
        return tuple(e.value.value for e in target.elements)
    return None


def _loader_iterators(ctx: FileContext) -> set:
    """The code of names (attribute chains) bound to ``iter(<a DataLoader>)``."""
    out = set()
    for n in astutil.walk(ctx.module, into_functions=True):
        if isinstance(n, cst.Assign) and isinstance(n.value, cst.Call) and isinstance(n.value.func, cst.Name) \
                and n.value.func.value == "iter" and n.value.args and is_loader_expr(n.value.args[0].value, ctx):
            out |= {code(t.target) for t in n.targets}
    return out


def _is_loader_next(value: cst.CSTNode, ctx: FileContext, iterators: set) -> bool:
    """``next(iter(loader))``, ``next(it)`` for ``it = iter(loader)``."""
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "next"
            and len(value.args) == 1):
        return False
    it = value.args[0].value
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "iter" and it.args:
        return is_loader_expr(it.args[0].value, ctx)
    return code(it) in iterators


def _function_defs(module: cst.Module) -> tuple[dict, dict]:
    """(module-level function name -> its def, id(method) -> {name: def} of its class's methods)."""
    functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    methods: dict = {}
    for n in astutil.walk(module, into_functions=True):
        if isinstance(n, cst.ClassDef) and isinstance(n.body, cst.IndentedBlock):
            own = {s.name.value: s for s in n.body.body if isinstance(s, cst.FunctionDef)}
            for fn in own.values():
                methods[id(fn)] = own
    return functions, methods


def _instance_methods(module: cst.Module) -> dict[str, dict]:
    """Names the file binds to instances of one of its module-level classes, anywhere
    (``trainer = Trainer(...)``), and never to anything else: name -> {method name: def}."""
    classes = {s.name.value: {f.name.value: f for f in s.body.body if isinstance(f, cst.FunctionDef)}
               for s in module.body if isinstance(s, cst.ClassDef) and isinstance(s.body, cst.IndentedBlock)}
    bound: dict[str, set] = {}
    for n in astutil.walk(module, into_functions=True):
        a = _single_assign(n)
        if a is not None and isinstance(a.targets[0].target, cst.Name):
            value = a.value
            made = value.func.value if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) else None
            bound.setdefault(a.targets[0].target.value, set()).add(made if made in classes else None)
    return {name: classes[next(iter(kinds))] for name, kinds in bound.items() if len(kinds) == 1 and None not in kinds}


def _item_of(value: cst.CSTNode, name: str) -> bool:
    """``name[0]``, ``name["image"]``: one item of a batch (a literal index or key)."""
    return isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name) and value.value.value == name \
        and len(value.slice) == 1 and isinstance(value.slice[0].slice, cst.Index) \
        and isinstance(value.slice[0].slice.value, (cst.Integer, cst.SimpleString))


def _unpacks(body: cst.CSTNode, name: str) -> list:
    """The statements of ``body`` (nested functions aside) that take ``name`` apart: ``x, y =
    name``, ``x, y = name[0], name[1]``, ``x = name["image"]``, ``x, y = (t.cuda() for t in
    name)``."""
    out = []
    for n in astutil.walk(body):
        a = _single_assign(n)
        if a is None:
            continue
        target, value = a.targets[0].target, a.value
        names = _target_names(target)
        if names is None:
            continue
        if isinstance(value, cst.Name) and value.value == name and len(names) > 1 \
                and isinstance(target, (cst.Tuple, cst.List)):
            out.append((n, names))
        elif len(names) == 1 and isinstance(target, cst.Name) and _item_of(value, name):
            out.append((n, names))
        elif isinstance(value, cst.Tuple) and isinstance(target, (cst.Tuple, cst.List)) \
                and len(value.elements) == len(names) and all(_item_of(e.value, name) for e in value.elements):
            out.append((n, names))
        elif isinstance(value, (cst.GeneratorExp, cst.ListComp)) and isinstance(target, (cst.Tuple, cst.List)) \
                and len(names) > 1 and value.for_in.inner_for_in is None and isinstance(value.for_in.iter, cst.Name) \
                and value.for_in.iter.value == name:
            out.append((n, names))  # `x, y = (t.to(device) for t in batch)`
    return out


def _batch_facts_of(ctx: FileContext) -> BatchFacts:
    facts = BatchFacts()
    if not loader_names(ctx):
        return facts
    iterators = _loader_iterators(ctx)
    functions, methods = _function_defs(ctx.module)
    instances = _instance_methods(ctx.module)
    singles: list = []  # (scope, scope body, single batch name)
    for scope, body in _scopes(ctx.module):
        for n in astutil.walk(body):
            if isinstance(n, cst.For):
                target = loader_batch_target(n, ctx)
                if isinstance(target, cst.Name):
                    singles.append((scope, body, target.value))
                continue
            a = _single_assign(n)
            if a is None or not _is_loader_next(a.value, ctx, iterators):
                continue
            names = _target_names(a.targets[0].target)
            if names is None:
                continue
            facts.bindings[id(n)] = BatchBinding(n, names, scope)
            if len(names) == 1:
                singles.append((scope, body, names[0]))
    seen = set()
    while singles:
        scope, body, name = singles.pop()
        if (id(scope), name) in seen:
            continue
        seen.add((id(scope), name))
        handed = not isinstance(scope, cst.Module) and name in [p.name.value for p in astutil.params(scope.params)] \
            and (id(scope), name) in facts.handed_over
        for stmt, names in _unpacks(body, name):
            facts.bindings[id(stmt)] = BatchBinding(stmt, names, scope, handed=handed)
        # handed to a function of the file (`train_step(model, batch)`) that unpacks it there
        for call in astutil.walk(body):
            if not isinstance(call, cst.Call):
                continue
            if isinstance(call.func, cst.Name):
                fn = functions.get(call.func.value)
            elif isinstance(call.func, cst.Attribute) and code(call.func.value) == "self":
                fn = methods.get(id(scope), {}).get(call.func.attr.value)
            elif isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name):
                fn = instances.get(call.func.value.value, {}).get(call.func.attr.value)  # `trainer.step(batch)`
            else:
                fn = None
            if fn is None:
                continue
            given = next((a for a in call.args if isinstance(a.value, cst.Name) and a.value.value == name), None)
            if given is None or given.star:
                continue
            positional = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
            if isinstance(call.func, cst.Attribute) and positional[:1] == ["self"]:
                positional = positional[1:]
            if given.keyword is not None:
                param = given.keyword.value
            else:
                index = [a for a in call.args if a.keyword is None].index(given)
                param = positional[index] if index < len(positional) else None
            if param is None or not _unpacks(fn.body, param):
                continue
            facts.handed_over.add((id(scope), name))
            facts.handed_over.add((id(fn), param))
            singles.append((fn, fn.body, param))
            seen.discard((id(fn), param))
    for b in facts.bindings.values():
        facts.names.setdefault(id(b.scope), set()).update(b.names)
    return facts


def handed_over(ctx: FileContext, scope: cst.CSTNode, name: str) -> bool:
    """The single batch name ``name`` of ``scope`` is given to a function of the file that
    unpacks it (where its parts become NumPy arrays)."""
    return (id(scope), name) in batch_facts(ctx).handed_over


def batch_binding(ctx: FileContext, stmt: cst.CSTNode) -> Optional[BatchBinding]:
    return batch_facts(ctx).bindings.get(id(stmt))


def bound_batch_names(ctx: FileContext) -> set:
    """The names the current node's function (or the module) binds to loader batches or their
    parts outside for loops' targets."""
    fn = ctx.enclosing(cst.FunctionDef)
    return batch_facts(ctx).names.get(id(fn if fn is not None else ctx.module), set())


def root_name(expr: cst.CSTNode) -> Optional[str]:
    while isinstance(expr, (cst.Attribute, cst.Subscript, cst.Call)):
        expr = expr.func if isinstance(expr, cst.Call) else expr.value
    return expr.value if isinstance(expr, cst.Name) else None


# --------------------------------------------------------------------------------------
# A loop in a method: `self.model`, `self.optimizer` ... read as plain names
# --------------------------------------------------------------------------------------
def self_aliases(loop: cst.CSTNode, fn: Optional[cst.FunctionDef]) -> dict[str, str]:
    """In a method, the ``self.x`` attributes the loop reads, as ``{"x": "self.x"}``, when
    none of them is also a local name of the method (then the loop is analysed with plain
    names and the attributes are put back in the code that stays in the method)."""
    if fn is None or not fn.params.params or fn.params.params[0].name.value != "self":
        return {}
    found: dict[str, str] = {}
    for n in astutil.walk(loop, into_functions=True):
        if isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == "self":
            found[n.attr.value] = f"self.{n.attr.value}"
    if not found or set(found) & (function_locals(fn) | _BUILTINS):
        return {}
    return found


class ToNames(cst.CSTTransformer):
    """``self.x`` -> ``x`` for the aliased attributes."""

    def __init__(self, aliases: dict[str, str]) -> None:
        super().__init__()
        self.aliases = aliases

    def leave_Attribute(self, original, updated):
        if isinstance(updated.value, cst.Name) and updated.value.value == "self" and updated.attr.value in self.aliases:
            return cst.Name(updated.attr.value, lpar=updated.lpar, rpar=updated.rpar)
        return updated


class RenameReads(cst.CSTTransformer):
    """Reads of the names in ``renames`` -> the new names (not attribute or keyword names)."""

    def __init__(self, renames: dict[str, str]) -> None:
        super().__init__()
        self.renames = renames
        self.skip: set[int] = set()

    def visit_Attribute(self, node):
        self.skip.add(id(node.attr))

    def visit_Arg(self, node):
        if node.keyword is not None:
            self.skip.add(id(node.keyword))

    def leave_Name(self, original, updated):
        if id(original) in self.skip or updated.value not in self.renames:
            return updated
        return updated.with_changes(value=self.renames[updated.value])


class ToAttributes(RenameReads):
    """``x`` -> ``self.x`` for the aliased names (not attribute or keyword names)."""

    def leave_Name(self, original, updated):
        if id(original) in self.skip or updated.value not in self.renames:
            return updated
        return cst.Attribute(cst.Name("self"), cst.Name(updated.value), lpar=updated.lpar, rpar=updated.rpar)


# --------------------------------------------------------------------------------------
# torch host code a port keeps, given the port's arrays (rule JX318)
# --------------------------------------------------------------------------------------
# torchvision's image helpers: they take a torch tensor (or a list of them) and write or
# arrange pixels on the host
TORCH_IMAGE_UTILS = ("torchvision.utils.save_image", "torchvision.utils.make_grid")
HANDOVER = ("torch.as_tensor", "torch.from_numpy")


def handed_to_torch(ctx: FileContext, call: cst.Call) -> bool:
    """``call`` (visited now) is `torch.as_tensor(...)` given as the image of one of
    TORCH_IMAGE_UTILS: the port's array handed over to the torch code it keeps (JX318's
    form), not torch code to port."""
    if ctx.qualname(call.func) not in HANDOVER:
        return False
    parent, grand = ctx.parent, ctx.enclosing(cst.Call)
    return (isinstance(parent, cst.Arg) and isinstance(grand, cst.Call) and bool(grand.args)
            and grand.args[0] is parent and ctx.qualname(grand.func) in TORCH_IMAGE_UTILS)


# --------------------------------------------------------------------------------------
# Random draws of the host loop (rule JX312; JX101 leaves them to it)
# --------------------------------------------------------------------------------------
HOST_DRAWS = ("torch.randn", "torch.rand", "torch.randint", "torch.randperm", "torch.normal")
# `torch.randn_like(x)` draws what `torch.randn(x.shape)` draws when x has the default dtype
HOST_LIKE_DRAWS = {"torch.randn_like": "torch.randn", "torch.rand_like": "torch.rand"}
_HOST_DRAW_KEYWORDS = ("dtype", "generator", "device", "low", "high", "size", "mean", "std")


def host_draw(ctx: FileContext, node: cst.Call) -> bool:
    """``node`` (visited now) is a torch random draw that runs on the host in the port and
    can stay torch's, its value handed to JAX as an array: a call of HOST_DRAWS with no
    `requires_grad=` / `out=` (or of HOST_LIKE_DRAWS with one positional argument and at most
    `device=`), outside any class, at a script's top level, in the top-level statements of a
    function that runs a training loop (its set-up: data, noise schedules), or in a loop body
    statement that no model value flows into (JX301 keeps such statements out of the jitted
    step: they run before its call). A draw in a model's forward, in a function the step may
    trace, or one fed by a forward value is left to the manual report."""
    qual = ctx.qualname(node.func) or ""
    if qual in HOST_LIKE_DRAWS:
        if (len(node.args) < 1 or node.args[0].keyword is not None or node.args[0].star
                or any(a.keyword is None or a.keyword.value != "device" for a in node.args[1:])):
            return False
    elif qual not in HOST_DRAWS:
        return False
    if any(a.star or (a.keyword is not None and a.keyword.value not in _HOST_DRAW_KEYWORDS) for a in node.args):
        return False
    if ctx.inside(cst.ClassDef, cst.Lambda):
        return False
    loop = ctx.enclosing(cst.For, cst.While)
    fn = ctx.enclosing(cst.FunctionDef)
    if loop is None and isinstance(fn, cst.FunctionDef) and fn in host_helpers(ctx):
        return True  # a data-building helper (make_series(n)) the script calls once, on the host
    if loop is None:
        return fn is None or _training_function_setup(ctx, fn)  # a script's or a trainer's top level
    if fn is not None and any(a is fn for a in ctx.ancestors[ctx.ancestors.index(loop):]):
        return False  # a def inside the loop
    if not isinstance(loop.body, cst.IndentedBlock):
        return False
    stmt = next((a for a in ctx.ancestors if any(a is s for s in loop.body.body)), None)
    if stmt is None:
        return False
    facts = file_facts(ctx)
    return id(stmt) not in _model_dependent(list(loop.body.body), facts.modules, ctx)


def host_helpers(ctx: FileContext) -> tuple:
    """Module-level functions whose every mention in the file is a call in code that runs once
    on the host: the script's top-level statements (the ``__main__`` guard's too) and the
    top-level statements of such functions themselves (``main()`` called from the guard, then
    ``make_series(n)`` called by ``main``). A function named anywhere else (in a loop, in
    another function, passed on as a value) is not one. (A module fact.)"""
    return module_fact(ctx, _host_helpers)


def _host_helpers(ctx: FileContext) -> tuple:
    functions = {s.name.value: s for s in ctx.module.body if isinstance(s, cst.FunctionDef)}
    mentions = Counter(n.value for n in astutil.walk(ctx.module, into_functions=True)
                       if isinstance(n, cst.Name) and n.value in functions)
    lines: list[cst.CSTNode] = []
    for stmt in ctx.module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            lines.append(stmt)
        elif isinstance(stmt, cst.If) and isinstance(stmt.body, cst.IndentedBlock) and "__main__" in \
                cst.Module([]).code_for_node(stmt.test):
            lines += [s for s in stmt.body.body if isinstance(s, cst.SimpleStatementLine)]
    found: dict[str, cst.FunctionDef] = {}
    calls: Counter = Counter()
    while lines:
        for line in lines:
            calls.update(n.func.value for n in astutil.walk(line)
                         if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in functions)
        lines = []
        for name, count in calls.items():
            # every mention but the def's own name is a host call
            if name not in found and mentions[name] == count + 1:
                fn = found[name] = functions[name]
                if isinstance(fn.body, cst.IndentedBlock):
                    lines += [s for s in fn.body.body if isinstance(s, cst.SimpleStatementLine)]
    return tuple(found.values())


def _training_function_setup(ctx: FileContext, fn: cst.FunctionDef) -> bool:
    """The node visited now lies in a statement of ``fn``'s own body (no compound statement
    between), and ``fn`` runs a training loop (a loop in it calls ``backward()``): code that
    runs once on the host, never inside a jitted step."""
    if not isinstance(fn.body, cst.IndentedBlock):
        return False
    at = ctx.ancestors.index(fn)
    chain = ctx.ancestors[at + 1:]
    if len(chain) < 2 or not any(chain[1] is s for s in fn.body.body) or not isinstance(chain[1], cst.SimpleStatementLine):
        return False
    steps = jitted_functions(ctx)
    return any(isinstance(n, (cst.For, cst.While)) and (has_backward(n) or any(
        isinstance(c, cst.Call) and isinstance(c.func, cst.Name) and c.func.value in steps
        for c in astutil.walk(n))) for n in astutil.walk(fn.body, into_functions=False))


# --------------------------------------------------------------------------------------
# torch's arrays of a layer, as the NNX layer holds them (rules JX301, JX019)
# --------------------------------------------------------------------------------------
# torch layer -> {torch attribute: (NNX attribute, transposed)}: nnx.Linear's kernel is
# (in, out), torch's weight (out, in)
LAYER_ARRAYS = {
    "Linear": {"weight": ("kernel", True), "bias": ("bias", False)},
    "Embedding": {"weight": ("embedding", False)},
    "LayerNorm": {"weight": ("scale", False), "bias": ("bias", False)},
}
_NNX_TO_TORCH = {"Linear": "Linear", "Embed": "Embedding", "LayerNorm": "LayerNorm"}


def layer_kind(ctx: FileContext, name: str) -> Optional[str]:
    """The torch layer (a key of LAYER_ARRAYS) that every assignment of the plain name
    ``name`` in the file builds (`nn.Linear(...)`, or the `nnx.Linear(...)` of its port);
    None where one builds something else or there is none."""
    return module_fact(ctx, _layer_kinds).get(name)


def _layer_kinds(ctx: FileContext) -> dict:
    kinds: dict[str, Optional[str]] = {}
    for node in astutil.walk(ctx.module, into_functions=True):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                for n in astutil.target_names(t.target) if not isinstance(t.target, cst.Name) else [t.target.value]:
                    kind = None
                    if isinstance(t.target, cst.Name) and isinstance(node.value, cst.Call):
                        qual = ctx.qualname(node.value.func) or ""
                        short = qual.rsplit(".", 1)[-1]
                        if qual.startswith("torch.nn.") and short in LAYER_ARRAYS:
                            kind = short
                        elif qual.startswith("flax.nnx.") and short in _NNX_TO_TORCH:
                            kind = _NNX_TO_TORCH[short]
                    kinds[n] = kind if kinds.get(n, kind) == kind else None
        elif isinstance(node, (cst.AugAssign, cst.AnnAssign, cst.For)):
            target = node.target
            for n in astutil.target_names(target) if not isinstance(target, cst.Name) else [target.value]:
                kinds[n] = None
    return kinds



def layer_array(ctx: FileContext, attr: cst.Attribute) -> Optional[tuple[str, str, bool]]:
    """``linear.weight`` (a plain name bound to a layer of LAYER_ARRAYS), or ``self.fc.weight``
    (an NNX layer of the enclosing module class, self_layer_kinds) -> (the layer's expression,
    the NNX attribute, whether torch's array is its transpose); None otherwise."""
    if isinstance(attr.value, cst.Name):
        name, kind = attr.value.value, layer_kind(ctx, attr.value.value)
    else:
        # `self.fc.weight` / `self.transformer.wte.weight`: a layer of the enclosing module class
        name = dotted_name(attr.value) or ""
        cls = next((a for a in reversed(ctx.ancestors) if isinstance(a, cst.ClassDef)), None)
        if not name.startswith("self.") or cls is None:
            return None
        kind = _NNX_TO_TORCH.get(self_layer_kinds(cls, ctx).get(name) or "")
    entry = LAYER_ARRAYS.get(kind or "", {}).get(attr.attr.value)
    return (name, *entry) if entry else None


# NNX layers whose arrays self_layer_kinds reports (their torch names: jx901's _NNX_NAMES)
_SELF_LAYERS = frozenset({"Linear", "Conv", "ConvTranspose", "Embed", "LayerNorm", "BatchNorm", "GroupNorm", "RMSNorm"})


def self_layer_kinds(cls: cst.ClassDef, ctx: FileContext) -> dict:
    """``self.fc`` / ``self.transformer.wte`` -> the NNX layer (``Linear``, ``Embed``...) that the
    methods of the class assign to it (directly, or as an entry of ``nnx.Dict(dict(wte=...))`` or ``nnx.Dict({'wte': ...})``);
    None for a path also assigned something else (a tied ``TorchTiedLinear``, another layer)
    than None."""
    out: dict = {}

    def kind(call) -> Optional[str]:
        qual = ctx.qualname(call.func) if isinstance(call, cst.Call) else None
        if qual and qual.startswith("flax.nnx.") and qual[len("flax.nnx."):] in _SELF_LAYERS:
            return qual[len("flax.nnx."):]
        return None

    def put(path: str, k: Optional[str]) -> None:
        out[path] = k if out.get(path, k) == k else None

    for n in astutil.walk(cls, into_functions=True):
        if not isinstance(n, cst.Assign) or len(n.targets) != 1:
            continue
        path = dotted_name(n.targets[0].target)
        if not path or not path.startswith("self."):
            continue
        value = n.value
        if code(value) in ("None", "nnx.data(None)"):
            continue  # an optional layer (JX018)
        if isinstance(value, cst.Call) and (ctx.qualname(value.func) or "") == "flax.nnx.Dict" and value.args:
            inner = value.args[0].value
            dict_call = isinstance(inner, cst.Call) and code(inner.func) == "dict"
            for a in inner.args if dict_call else value.args:
                if a.keyword is not None:
                    put(f"{path}.{a.keyword.value}", kind(a.value))
            if isinstance(inner, cst.Dict):  # nnx.Dict({'wte': ...}): its string keys
                for el in inner.elements:
                    if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString) \
                            and el.key.evaluated_value.isidentifier():
                        put(f"{path}.{el.key.evaluated_value}", kind(el.value))
            continue
        put(path, kind(value))
    return out


# --------------------------------------------------------------------------------------
# A loop that trains in one phase only (JX321 splits it; JX301 leaves it to that)
# --------------------------------------------------------------------------------------
_GRAD_MODES = ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled", "torch.autograd.grad_mode.set_grad_enabled")


def grad_mode(stmt: cst.BaseStatement, ctx) -> Optional[cst.BaseExpression]:
    """The argument of ``with torch.set_grad_enabled(c):`` (its only item), else None."""
    if isinstance(stmt, cst.With) and len(stmt.items) == 1 and stmt.items[0].asname is None:
        call = stmt.items[0].item
        if isinstance(call, cst.Call) and ctx.qualname(call.func) in _GRAD_MODES and len(call.args) == 1 \
                and call.args[0].keyword is None:
            return call.args[0].value
    return None


def _backward_test(stmts, ctx) -> Optional[cst.BaseExpression]:
    """The condition of an `if` of the loop body (or of a `with torch.set_grad_enabled(...)`
    block in it) whose body runs a backward pass."""
    for s in stmts:
        inner = s.body.body if grad_mode(s, ctx) is not None and isinstance(s.body, cst.IndentedBlock) else [s]
        for t in inner:
            if isinstance(t, cst.If) and has_backward(t.body):
                return t.test
    return None


def phase_test(loop: cst.CSTNode, ctx: FileContext) -> Optional[cst.BaseExpression]:
    """For a `for` loop whose body trains only under a condition the loop does not change
    (`if phase == "train": loss.backward(); optimizer.step()`, maybe inside `with
    torch.set_grad_enabled(phase == "train"):`): that condition; else None. The condition
    calls nothing and reads no name the loop binds."""
    if not isinstance(loop, cst.For) or loop.orelse is not None or loop.asynchronous \
            or not isinstance(loop.body, cst.IndentedBlock):
        return None
    stmts = list(loop.body.body)
    test = _backward_test(stmts, ctx)
    if test is None:
        return None
    bound = bound_in(stmts) | set(astutil.target_names(loop.target))
    if any(isinstance(n, (cst.Call, cst.Await, cst.Yield, cst.NamedExpr, cst.Lambda)) for n in astutil.walk(test)) \
            or set(astutil.reads(test)) & bound:
        return None
    return test
