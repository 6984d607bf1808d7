"""What the file binds its names to, and which expressions are the XLA device (shared by the
device-placement and loader rules).

The binding index is a module fact: every name (``device``, ``args.device``) with the values
assigned to it anywhere in the file, and None for a binding porter cannot read (a parameter,
a loop or ``with`` target, an augmented or tuple assignment, an import). It is read by name,
not by scope: a value is trusted only when every binding of that spelling in the file agrees.
"""
from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from porter.astutil import arg, children, rebinds_globals, string_value, target_names, walk
from porter.context import FileContext, dotted_name
from porter.rules import computed_module_fact, module_fact

from ._tables import CURRENT_ACCELERATOR, XLA_DEVICE, device_choice, is_cuda_string, is_string, only_availability
from ._device_strings import returned
from ._training import DTYPES

XLA_DEVICE_CALLS = ("torch_xla.device", XLA_DEVICE, CURRENT_ACCELERATOR)


Binding = tuple[Optional[cst.FunctionDef], Optional[cst.BaseExpression], bool]  # scope, value, a parameter


def _binding_walk(ctx: FileContext) -> dict[str, tuple[Binding, ...]]:
    found: dict[str, list[Binding]] = {}

    def visit(node: cst.CSTNode, scope: Optional[cst.FunctionDef]) -> None:
        def add(name: Optional[str], value: Optional[cst.BaseExpression]) -> None:
            if name is not None:
                found.setdefault(name, []).append((scope, value, False))

        def unknown(target: cst.CSTNode) -> None:
            for name in target_names(target):
                add(name, None)

        n = node
        if isinstance(n, cst.Assign):
            for t in n.targets:
                if isinstance(t.target, (cst.Name, cst.Attribute)):
                    add(dotted_name(t.target), n.value)
                else:
                    unknown(t.target)
        elif isinstance(n, cst.AnnAssign):
            add(dotted_name(n.target), n.value)
        elif isinstance(n, cst.AugAssign):
            add(dotted_name(n.target), None)
        elif isinstance(n, (cst.For, cst.CompFor)):
            unknown(n.target)
        elif isinstance(n, cst.WithItem) and n.asname is not None:
            unknown(n.asname.name)
        elif isinstance(n, cst.NamedExpr):
            unknown(n.target)
        elif isinstance(n, (cst.Global, cst.Nonlocal)):
            for item in n.names:
                add(item.name.value, None)
        elif isinstance(n, (cst.FunctionDef, cst.ClassDef)):
            add(n.name.value, None)
        inner = scope
        if isinstance(n, cst.FunctionDef):
            inner = n
            for p in walk(n.params, into_functions=False):
                if isinstance(p, cst.Param):
                    found.setdefault(p.name.value, []).append((n, None, True))
        for child in children(n):
            if isinstance(n, cst.FunctionDef) and child is n.params:
                continue
            visit(child, inner)

    visit(ctx.module, None)
    return {k: tuple(v) for k, v in found.items()}


def _bindings(ctx: FileContext) -> dict[str, tuple[Binding, ...]]:
    """Every binding of each name in the file, in any scope."""
    return computed_module_fact(ctx, _binding_walk)


def _module_bindings(ctx: FileContext) -> dict[str, tuple[Binding, ...]]:
    """The module-level bindings of each name. Kept apart from the functions' bindings so that a
    lookup from one statement does not answer with nodes of another statement's function
    (porter lsp reuses a statement's findings while its lookups answer the same)."""
    out = {name: tuple(b for b in every if b[0] is None) for name, every in computed_module_fact(ctx, _binding_walk).items()}
    return {name: found for name, found in out.items() if found}


def _function_bindings(ctx: FileContext) -> dict[tuple[cst.FunctionDef, str], tuple[Binding, ...]]:
    """(function, name) -> the bindings of name in that function's own scope."""
    out: dict[tuple[cst.FunctionDef, str], list[Binding]] = {}
    for name, every in computed_module_fact(ctx, _binding_walk).items():
        for b in every:
            if b[0] is not None:
                out.setdefault((b[0], name), []).append(b)
    return {k: tuple(v) for k, v in out.items()}


def _scoped(ctx: FileContext, name: str, functions: Sequence[cst.FunctionDef]) -> tuple[Optional[cst.FunctionDef], list[Binding]]:
    """The bindings of a plain name read inside ``functions`` (outermost first): those of the
    innermost one that binds it, else the module's; with that function (None: the module)."""
    local = module_fact(ctx, _function_bindings)
    for fn in reversed(functions):
        if (fn, name) in local:
            return fn, list(local[(fn, name)])
    return None, list(module_fact(ctx, _module_bindings).get(name, ()))


def bindings(ctx: FileContext, name: str, scoped: bool = False) -> tuple[Optional[cst.BaseExpression], ...]:
    """The values bound to ``name`` in the file (None: a binding that is not a plain value).
    ``scoped``: only those of the innermost enclosing function that binds it (else the
    module's), for a plain name read at the current node."""
    if scoped:
        functions = [a for a in ctx.ancestors if isinstance(a, cst.FunctionDef)]
        return tuple(b[1] for b in _scoped(ctx, name, functions)[1])
    return tuple(b[1] for b in module_fact(ctx, _bindings).get(name, ()))


def _calls(ctx: FileContext) -> dict[str, tuple[tuple[tuple[cst.FunctionDef, ...], cst.Call], ...]]:
    """Calls of plain names (``train(...)``), with the functions they sit in (outermost first)."""
    found: dict[str, list] = {}

    def visit(node: cst.CSTNode, chain: tuple) -> None:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
            found.setdefault(node.func.value, []).append((chain, node))
        inner = (*chain, node) if isinstance(node, cst.FunctionDef) else chain
        for child in children(node):
            visit(child, inner)

    visit(ctx.module, ())
    return {k: tuple(v) for k, v in found.items()}


def is_xla_device_expr(expr: cst.CSTNode, ctx: FileContext) -> bool:
    """``torch_xla.device()``, ``xm.xla_device()``, or what the TX1 rules make the XLA device:
    ``torch.device('cuda')``, ``'cuda:0'``, ``'cuda' if torch.cuda.is_available() else 'cpu'``;
    a call of a function of the module that returns one on every path (``get_device()``)."""
    return _is_xla(expr, ctx, True)


def _is_xla(expr: cst.CSTNode, ctx: FileContext, functions: bool) -> bool:
    if isinstance(expr, cst.Call):
        name = ctx.qualname(expr.func)
        if name in XLA_DEVICE_CALLS:
            return True
        if name == "torch.device":
            first = arg(expr, "type", 0)
            return first is not None and _is_xla(first.value, ctx, False)
        return functions and isinstance(expr.func, cst.Name) and expr.func.value in module_fact(ctx, _xla_functions)
    if is_cuda_string(expr) or is_string(expr, "xla"):
        return True
    choice = device_choice(expr, ctx)
    return choice is not None and only_availability(choice.node.test, ctx)


def _xla_functions(ctx: FileContext) -> frozenset:
    """The names of the module's functions that return the XLA device on every path (``def
    get_device(): return 'xla'``, after TX107 folded its CUDA test and TX103 its string): each
    undecorated, the name's one binding at module level (and no import's), its body ending in
    a ``return``, every value it returns an XLA device expression."""
    once = {name for name, found in module_fact(ctx, _module_bindings).items() if len(found) == 1}
    found: set[str] = set()
    for fn in ctx.module.body:
        if not isinstance(fn, cst.FunctionDef) or fn.name.value not in once or fn.name.value in ctx.aliases \
                or fn.decorators or fn.asynchronous:
            continue
        body = fn.body.body if isinstance(fn.body, cst.IndentedBlock) else ()
        last = body[-1] if body else None
        if not (isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], cst.Return)):
            continue
        values = [n.value for n in walk(fn.body) if isinstance(n, cst.Return)]
        if any(isinstance(n, cst.Yield) for n in walk(fn.body)):
            continue
        if values and all(v is not None and (_is_xla(v, ctx, False) or isinstance(v, cst.IfExp) and all(
                arm is not None and _is_xla(arm, ctx, False) for arm in returned(v))) for v in values):
            found.add(fn.name.value)
    return frozenset(found)


def xla_device_value(expr: cst.BaseExpression, ctx: FileContext, at: Optional[cst.CSTNode] = None) -> bool:
    """``expr`` provably holds the XLA device in the port: an XLA device expression, or a name
    every binding of which in its scope is one; for a parameter of the enclosing function, every
    call of that function in the file passes one (two calls deep at most)."""
    if is_xla_device_expr(expr, ctx):
        return True
    name = dotted_name(expr)
    if name is None:
        return False
    root = name.split(".")[0]
    if any(isinstance(s, cst.Lambda) for s in ctx.ancestors):
        return False
    functions = [a for a in ctx.ancestors if isinstance(a, cst.FunctionDef)]
    if root != name:
        if any(b[1] is None for b in _scoped(ctx, root, functions)[1]):
            return False  # `args.device` with `args` a parameter or a loop target
        values = bindings(ctx, name)
        return bool(values) and all(v is not None and is_xla_device_expr(v, ctx) for v in values)
    return _name_is_xla(ctx, name, functions, 0)


def _name_is_xla(ctx: FileContext, name: str, functions: Sequence[cst.FunctionDef], depth: int) -> bool:
    fn, found = _scoped(ctx, name, functions)
    if not found:
        return False
    for _, value, param in found:
        if param:
            if fn is None or depth >= 2 or not _callers_pass_xla(ctx, fn, name, depth + 1):
                return False
        elif value is None or not is_xla_device_expr(value, ctx):
            return False
        elif fn is None and not isinstance(value, cst.Call) and rebinds_globals(ctx):
            return False  # a configuration string (`device = 'cuda'`) that exec()/globals() may set
    return True


def _callers_pass_xla(ctx: FileContext, fn: cst.FunctionDef, name: str, depth: int) -> bool:
    """Every call of the module-level or nested function ``fn`` in the file passes the XLA
    device as its parameter ``name`` (and there is at least one call)."""
    positional = [*fn.params.posonly_params, *fn.params.params]
    index = next((i for i, p in enumerate(positional) if p.name.value == name), None)
    calls = module_fact(ctx, _calls).get(fn.name.value, ())
    if not calls:
        return False
    for chain, call in calls:
        given = None
        for i, a in enumerate(call.args):
            if a.star:
                return False
            if a.keyword is not None and a.keyword.value == name or a.keyword is None and i == index:
                given = a.value
        if given is None:
            return False
        if is_xla_device_expr(given, ctx):
            continue
        if not (isinstance(given, cst.Name) and _name_is_xla(ctx, given.value, chain, depth)):
            return False
    return True


DEVICE_VARIABLE = "device"


def device_variable(ctx: FileContext) -> Optional[str]:
    """The script's device variable where the current node can read it, else None: a
    parameter ``device`` of an enclosing function, a ``device = ...`` in a statement of the
    enclosing function before the current one, or (for code in a function, or module-level code
    after it) a module-level ``device = ...``. Heuristic by spelling: only the name ``device``."""
    anc = ctx.ancestors
    functions = [i for i, a in enumerate(anc) if isinstance(a, cst.FunctionDef)]
    local = module_fact(ctx, _function_bindings)
    for i in reversed(functions):
        fn = anc[i]
        assert isinstance(fn, cst.FunctionDef)
        if any(isinstance(p, cst.Param) and p.name.value == DEVICE_VARIABLE for p in walk(fn.params)):
            return DEVICE_VARIABLE
        if _assigned_before(anc[i + 1:]):
            return DEVICE_VARIABLE
        if (fn, DEVICE_VARIABLE) in local:
            return None  # assigned in this function, but not before the current statement
    module_level = [b[1] for b in module_fact(ctx, _module_bindings).get(DEVICE_VARIABLE, ())]
    if not module_level or None in module_level:
        return None
    if functions:
        return DEVICE_VARIABLE
    if len(anc) > 1 and _assigned_before(anc[1:]):
        return DEVICE_VARIABLE  # earlier in the same top-level statement
    if len(anc) > 1:
        earlier = module_fact(ctx, _device_statements).get(anc[1])
        return DEVICE_VARIABLE if earlier else None
    return None


def _device_statements(ctx: FileContext) -> dict[cst.CSTNode, bool]:
    """Each top-level statement -> whether an earlier one assigns the device variable."""
    out: dict[cst.CSTNode, bool] = {}
    seen = False
    for stmt in ctx.module.body:
        out[stmt] = seen
        seen = seen or _assigned_before([cst.Module([stmt]), None])
    return out


def _assigned_before(path: list) -> bool:
    """On the ancestor ``path`` (from a function or the module down to the current node), a
    statement before the one the path goes through assigns the device variable (also inside
    its `if`/`with`/`try` blocks), in any block along the way."""
    for i, node in enumerate(path[:-1]):
        if not isinstance(node, (cst.Module, cst.IndentedBlock)):
            continue
        for stmt in node.body:
            if stmt is path[i + 1]:
                break
            for n in walk(stmt):
                if isinstance(n, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == DEVICE_VARIABLE
                                                     for t in n.targets):
                    return True
    return False


def placement_expr(ctx: FileContext) -> cst.BaseExpression:
    """Where inserted or rewritten code places tensors: the script's device variable when it
    has one here (so one device decides, also when a user's flag keeps it on the CPU), else
    ``torch_xla.device()``."""
    name = device_variable(ctx)
    if name is not None:
        return cst.Name(name)
    return cst.parse_expression(f"{ctx.module_alias('torch_xla')}.device()")


# --------------------------------------------------------------------------------------
# Integer device ordinals (`.to(local_rank)`: CUDA device number local_rank)
# --------------------------------------------------------------------------------------
RANK_CALLS = ("builtins.int", "torch.distributed.get_rank", "torch.distributed.get_node_local_rank",
              "torch_xla.runtime.global_ordinal", "torch_xla.runtime.local_ordinal")
# Names that hold a GPU number by the usual spelling (a parameter, or an attribute of the
# parsed arguments): a heuristic, so what uses them gets an unsafe fix.
RANK_NAMES = ("rank", "local_rank", "gpu", "gpu_id", "device_id", "local_gpu", "gpu_index")
PROVABLE, SPELLING = "provable", "spelling"


def int_ordinal(expr: cst.CSTNode, ctx: FileContext) -> Optional[str]:
    """Whether ``expr`` is a CUDA device number: PROVABLE (an integer literal, or a plain name
    every binding of which in its scope is one, or a call of int(), dist.get_rank() and the
    like), SPELLING (a parameter or an attribute named rank/local_rank/gpu/...), else None."""
    if isinstance(expr, cst.Integer):
        return PROVABLE
    if isinstance(expr, cst.Call) and ctx.qualname(expr.func) in RANK_CALLS:
        return PROVABLE
    if isinstance(expr, cst.Name):
        functions = [a for a in ctx.ancestors if isinstance(a, cst.FunctionDef)]
        _, found = _scoped(ctx, expr.value, functions)
        if found and all(not param and value is not None and _int_value(value, ctx) for _, value, param in found):
            return PROVABLE
        if found and all(param or value is not None and _int_value(value, ctx) for _, value, param in found):
            return SPELLING if expr.value in RANK_NAMES else None
        return None
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
        values = _self_attribute_values(ctx, expr.attr.value)
        if values and all(_int_value(v, ctx) for v in values):
            return PROVABLE  # `self.gpu_id = int(os.environ["LOCAL_RANK"])` wherever the class sets it
    if isinstance(expr, cst.Attribute) and expr.attr.value in RANK_NAMES and isinstance(expr.value, cst.Name):
        return SPELLING if expr.value.value in ("args", "opt", "opts", "cfg", "config", "flags", "FLAGS", "self") else None
    return None


def _self_attribute_values(ctx: FileContext, attr: str) -> list:
    """The values the enclosing class's methods assign to ``self.<attr>`` (plain ``=``, one
    target, the name not unpacked); empty when it is also bound any other way (``+=``, an
    unpacking, a ``for`` target), or outside a class."""
    cls = ctx.enclosing(cst.ClassDef)
    if cls is None:
        return []
    key = ("devices.self_attribute_values", cls, attr)
    if key in ctx.cache:
        return ctx.cache[key]

    def is_it(node: cst.CSTNode) -> bool:
        return (isinstance(node, cst.Attribute) and node.attr.value == attr and isinstance(node.value, cst.Name)
                and node.value.value == "self")

    values: list = []
    for n in walk(cls, into_functions=True):
        if isinstance(n, cst.Assign):
            for t in n.targets:
                if is_it(t.target):
                    values.append(n.value)
                elif any(is_it(x) for x in walk(t.target)):
                    values = [None]
        elif isinstance(n, (cst.AugAssign, cst.AnnAssign, cst.For)) and any(is_it(x) for x in walk(n.target)):
            values = [None]
        if values[:1] == [None]:
            break
    result = [] if values[:1] == [None] else values
    ctx.cache[key] = result
    return result


def _int_value(value: cst.CSTNode, ctx: FileContext) -> bool:
    if isinstance(value, cst.Integer):
        return True
    return isinstance(value, cst.Call) and ctx.qualname(value.func) in RANK_CALLS


# Calls whose first positional argument is a device *type* string ('cuda', 'cpu', 'xla').
_DEVICE_TYPE_CALLS = ("torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler", "torch.get_autocast_dtype",
                      "torch.is_autocast_available", "torch.amp.custom_fwd", "torch.amp.custom_bwd")


# methods of str that a torch.device lacks: `device.startswith('cuda')` reads a string
_STR_METHODS = frozenset({"startswith", "endswith", "split", "rsplit", "partition", "rpartition", "replace",
                          "lower", "upper", "strip", "lstrip", "rstrip", "find", "rfind", "count", "removeprefix",
                          "removesuffix", "isdigit", "format"})


def _device_type_walk(ctx: FileContext) -> frozenset:
    """Names (``device_type``, ``args.device_type``, ``device``) the file uses as a device
    string: passed as ``device_type=``, as the first argument of ``torch.autocast``/
    ``GradScaler``, compared with a string literal (``device_type == 'cpu'``, ``kind in
    ('cuda', 'mps')``), searched for one (``'cuda' in device``), or given to a method of str
    (``device.startswith('cuda')``, ``device.split(':')``) or sliced (``device[:4]``): a
    torch.device has none of those."""
    found: set[str] = set()
    for n in walk(ctx.module, into_functions=True):
        if isinstance(n, cst.Subscript):
            name = dotted_name(n.value)
            if name is not None and all(isinstance(e.slice, cst.Slice) for e in n.slice):
                found.add(name)
            continue
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in _STR_METHODS:
            name = dotted_name(n.func.value)
            if name is not None:
                found.add(name)
        if isinstance(n, cst.Call):
            for a in n.args:
                if a.keyword is not None and a.keyword.value == "device_type":
                    name = dotted_name(a.value)
                    if name is not None:
                        found.add(name)
            if n.args and n.args[0].keyword is None and ctx.qualname(n.func) in _DEVICE_TYPE_CALLS:
                name = dotted_name(n.args[0].value)
                if name is not None:
                    found.add(name)
        elif isinstance(n, cst.Comparison):
            operands = [n.left, *(c.comparator for c in n.comparisons)]
            ops = [c.operator for c in n.comparisons]
            for i, op in enumerate(ops):
                left, right = operands[i], operands[i + 1]
                if isinstance(op, (cst.Equal, cst.NotEqual)):
                    pairs = ((left, right), (right, left))
                elif isinstance(op, (cst.In, cst.NotIn)) and isinstance(right, (cst.Tuple, cst.List, cst.Set)):
                    pairs = ((left, right),)
                elif isinstance(op, (cst.In, cst.NotIn)) and string_value(left) is not None:
                    pairs = ((right, left),)  # `'cuda' in device`: a substring test
                else:
                    continue
                for named, other in pairs:
                    strings = [e.value for e in other.elements] if isinstance(other, (cst.Tuple, cst.List, cst.Set)) else [other]
                    name = dotted_name(named)
                    if name is not None and strings and all(string_value(s) is not None for s in strings):
                        found.add(name)
    return frozenset(found)


def used_as_device_type(ctx: FileContext, name: Optional[str]) -> bool:
    """The file uses ``name`` as a device type string (see _device_type_walk): a CUDA choice
    bound to it stays a string ('xla'), not a torch.device."""
    return name is not None and name in module_fact(ctx, _device_type_walk)


def _placement_walk(ctx: FileContext) -> bool:
    """The file places something on a device: a `.to(...)`/`.cuda(...)` call, a `device=`
    argument, `torch.set_default_device(...)` or a `with torch.device(...):` block. A device
    value alone places nothing (a tutorial that prints `torch.device('cuda' if ... else 'cpu')`
    and trains on the CPU)."""
    for n in walk(ctx.module, into_functions=True):
        if isinstance(n, cst.WithItem) and isinstance(n.item, cst.Call) \
                and ctx.qualname(n.item.func) in ("torch.device", *XLA_DEVICE_CALLS):
            return True
        if not isinstance(n, cst.Call):
            continue
        if isinstance(n.func, cst.Attribute) and n.func.attr.value in ("to", "cuda") and (n.args or n.func.attr.value == "cuda"):
            if n.func.attr.value == "to" and _dtype_only(n, ctx):
                continue  # `x.to(torch.float32)`: a conversion, not a placement
            return True
        if any(a.keyword is not None and a.keyword.value == "device" for a in n.args):
            return True
        if ctx.qualname(n.func) == "torch.set_default_device":
            return True
    return False


def _dtype_only(call: cst.Call, ctx: FileContext) -> bool:
    """`.to(torch.float32)`, `.to(torch.get_default_dtype())`, `.to(dtype=...)`: only a dtype."""
    if len(call.args) != 1:
        return False
    only = call.args[0]
    if only.keyword is not None:
        return only.keyword.value == "dtype"
    name = ctx.qualname(only.value.func if isinstance(only.value, cst.Call) else only.value) or ""
    return name == "torch.get_default_dtype" or (name.startswith("torch.") and name.split(".", 1)[1] in DTYPES)


def places_on_device(ctx: FileContext) -> bool:
    """Whether the file moves anything to a device (a CPU-only script does not)."""
    return bool(module_fact(ctx, _placement_walk))
