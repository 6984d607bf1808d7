"""Device strings kept in variables: ``device = 'cuda'`` (a script's configuration value that a
configurator or ``--device=`` may override) and how the file reads each such variable.

A variable is *a device string* when a binding of it in its scope is a CUDA device string
(``'cuda'``, ``'cuda:0'``, ``f'cuda:{rank}'``) or ``'xla'`` and every other one is a device too:
another device string (``'cpu'``, ``'mps'``: a user's choice, kept), a CUDA device number (an
integer literal) or a ``torch.device(...)`` (``device = torch.device(device)`` after an
``if``/``elif`` chain of strings); or when every binding is a device and one a CUDA number
(``device = 0``) and the file reads it as a device and only so (or as text). Each read of it is
one of:

* a device use: the first argument of ``torch.device(...)``, ``.to(...)``,
  ``torch.cuda.set_device(...)``, ``torch.cuda.device(...)``; ``device=`` of a torch function or
  of a tensor's ``new_*``/``.to`` method; ``map_location=`` of ``torch.load``;
* a device-type test: compared with string literals (``device == 'cuda'``, ``'cuda' in device``,
  ``device in ('cuda', 'mps')``, ``device.startswith('cuda')``); its CUDA literals are the ones a
  port tests as ``'xla'``;
* text: an argument of ``print(...)`` or a value formatted into an f-string (only the printed
  text changes with the value);
* passed to a parameter of a function of the file that reads it only as a device or as text
  (or passes it on to such a parameter) and never rebinds it: a device use too;
* anything else (passed to another function of the program, stored in a structure, returned,
  assigned on): porter cannot tell what it does with the string.

The fact maps nodes to what they are, so that a rule asks about the node it visits:
``DEVICE_VALUE`` for a binding's CUDA string (or number) of a variable all of whose reads are
device uses, tests or text (and that the file reads at least once: a module-level name nobody
reads here may be imported by another file), ``DEVICE_READ`` for those reads; ``DEVICE_TEST`` for a CUDA literal in a device-type test of
such a variable; ``OTHER_USE`` for a read of a device string variable (with a CUDA binding)
that is none of those, the reason its binding stays.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.astutil import children, target_names
from porter.context import FileContext
from porter.device_options import OTHER_USE, classify_read, device_string, is_cuda_string, option_blocker  # noqa: F401
from porter.rules import module_fact

from ._tables import is_string

DEVICE_VALUE = "value"
DEVICE_TEST = "test"
DEVICE_READ = "read"
# the other devices a device variable may be set to (`if args.cuda: device = 'cuda' elif
# args.mps: device = 'mps' else: device = 'cpu'`), kept as the user chose them
_OTHER_DEVICES = ("xla", "cpu", "mps", "xpu", "meta")

_Scope = Optional[cst.CSTNode]  # a FunctionDef, Lambda or ClassDef; None: the module


def _walk(ctx: FileContext) -> dict:
    bindings: dict[tuple[_Scope, str], list[Optional[cst.BaseExpression]]] = {}
    reads: list[tuple[tuple, str, cst.Name, str, tuple]] = []
    order: dict[int, int] = {}  # id(binding value or read) -> its place in the source, in order of effect
    bound_by: dict[int, list[tuple[_Scope, str]]] = {}  # id(binding value) -> the variables it binds
    functions: dict[tuple[_Scope, str], cst.FunctionDef] = {}  # the file's undecorated functions
    returns: dict[cst.FunctionDef, list[Optional[cst.BaseExpression]]] = {}
    generators: set[cst.FunctionDef] = set()
    calls: list[tuple[tuple, str, cst.Call, str, tuple]] = []  # f(...) of a name: how its value is read
    passed: dict[int, tuple[tuple, str, object]] = {}  # id(read) -> (chain, f, position or keyword) of f(..., read)

    def bind(chain: tuple, name: Optional[str], value: Optional[cst.BaseExpression]) -> None:
        if name is not None:
            bindings.setdefault((chain[-1] if chain else None, name), []).append(value)
            if value is not None:
                order[id(value)] = len(order)
                bound_by.setdefault(id(value), []).append((chain[-1] if chain else None, name))

    def unknown(chain: tuple, target: cst.CSTNode) -> None:
        names = list(target_names(target))
        for name in names:
            bind(chain, name, None)
        if not names or not isinstance(target, (cst.Name, cst.Tuple, cst.List, cst.StarredElement)):
            visit(target, chain, [])

    def visit(node: cst.CSTNode, chain: tuple, stack: list) -> None:
        stack = [*stack[-3:], node]
        n = node
        if isinstance(n, cst.Name):
            kind, literals = classify_read(n, stack, ctx)
            reads.append((chain, n.value, n, kind, literals))
            order[id(n)] = len(order)
            parent = stack[-2] if len(stack) >= 2 else None
            grand = stack[-3] if len(stack) >= 3 else None
            if kind == OTHER_USE and isinstance(parent, cst.Arg) and parent.value is n and not parent.star \
                    and isinstance(grand, cst.Call) and isinstance(grand.func, cst.Name):
                where = parent.keyword.value if parent.keyword is not None else grand.args.index(parent)
                if parent.keyword is not None or all(a.keyword is None and not a.star for a in grand.args[:where]):
                    passed[id(n)] = (chain, grand.func.value, where)
            if isinstance(parent, cst.Call) and parent.func is n:
                calls.append((chain, n.value, parent, *classify_read(parent, stack[:-1], ctx)))  # type: ignore[arg-type]
            return
        if isinstance(n, (cst.Return, cst.Yield)) and chain and isinstance(chain[-1], cst.FunctionDef):
            if isinstance(n, cst.Return):
                returns.setdefault(chain[-1], []).extend(returned(n.value))
            else:
                generators.add(chain[-1])
        if isinstance(n, cst.Assign):
            visit(n.value, chain, stack)  # `device = torch.device(device)` reads the old value, then binds
            for t in n.targets:
                if isinstance(t.target, cst.Name):
                    bind(chain, t.target.value, n.value)
                else:
                    unknown(chain, t.target)
            return
        if isinstance(n, cst.AnnAssign):
            if isinstance(n.target, cst.Name):
                bind(chain, n.target.value, n.value)
            else:
                visit(n.target, chain, stack)
            visit(n.annotation, chain, stack)
            if n.value is not None:
                visit(n.value, chain, stack)
            return
        if isinstance(n, cst.AugAssign):
            unknown(chain, n.target)
            if isinstance(n.target, cst.Name):
                reads.append((chain, n.target.value, n.target, OTHER_USE, ()))
            visit(n.value, chain, stack)
            return
        if isinstance(n, (cst.For, cst.CompFor)):
            unknown(chain, n.target)
        elif isinstance(n, cst.WithItem) and n.asname is not None:
            unknown(chain, n.asname.name)
            visit(n.item, chain, stack)
            return
        elif isinstance(n, cst.NamedExpr):
            unknown(chain, n.target)
            visit(n.value, chain, stack)
            return
        elif isinstance(n, (cst.Global, cst.Nonlocal)):
            for item in n.names:
                bind(chain, item.name.value, None)
                bind((), item.name.value, None)
            return
        elif isinstance(n, cst.Del):
            unknown(chain, n.target)
            return
        elif isinstance(n, (cst.Import, cst.ImportFrom)):
            if not isinstance(n.names, cst.ImportStar):
                for alias in n.names:
                    name = alias.asname.name if alias.asname is not None else alias.name
                    while isinstance(name, cst.Attribute):
                        name = name.value
                    if isinstance(name, cst.Name):
                        bind(chain, name.value, None)
            return
        elif isinstance(n, cst.ExceptHandler) and n.name is not None:
            unknown(chain, n.name.name)
            if n.type is not None:
                visit(n.type, chain, stack)
            visit(n.body, chain, stack)
            return
        elif isinstance(n, (cst.FunctionDef, cst.ClassDef)):
            bind(chain, n.name.value, None)
            if isinstance(n, cst.FunctionDef) and not n.decorators and not n.asynchronous:
                functions[(chain[-1] if chain else None, n.name.value)] = n
            for d in n.decorators:
                visit(d, chain, stack)
            inner = (*chain, n)
            if isinstance(n, cst.FunctionDef):
                _params(n.params, chain, inner, bind, visit, stack)
                if n.returns is not None:
                    visit(n.returns, chain, stack)
            else:
                for a in (*n.bases, *n.keywords):
                    visit(a, chain, stack)
            visit(n.body, inner, [])
            return
        elif isinstance(n, cst.Lambda):
            inner = (*chain, n)
            _params(n.params, chain, inner, bind, visit, stack)
            visit(n.body, inner, [])
            return
        elif isinstance(n, cst.Attribute):
            visit(n.value, chain, stack)
            return
        elif isinstance(n, cst.Arg):
            visit(n.value, chain, stack)
            return
        for child in children(n):
            visit(child, chain, stack)

    visit(ctx.module, (), [])

    def resolve(chain: tuple, name: str) -> tuple[_Scope, str]:
        for i in range(len(chain) - 1, -1, -1):
            scope = chain[i]
            if isinstance(scope, cst.ClassDef) and i != len(chain) - 1:
                continue  # a class body's names are not visible in its methods
            if (scope, name) in bindings:
                return scope, name
        return None, name

    uses: dict[tuple[_Scope, str], list[tuple[cst.Name, str, tuple]]] = {}
    for chain, name, node, kind, literals in reads:
        uses.setdefault(resolve(chain, name), []).append((node, kind, literals))
    called: dict[tuple[_Scope, str], list[tuple[cst.Call, str, tuple]]] = {}
    for chain, name, call, kind, literals in calls:
        called.setdefault(resolve(chain, name), []).append((call, kind, literals))
    _follow_device_parameters(uses, passed, functions, bindings, resolve)

    # device functions: `def get_device(): return 'cuda' if ... else 'cpu'`, every return a
    # device string (one CUDA), the name only ever called, each call's value read as a device
    # use, a test or text, or bound to a variable read only so: its CUDA returns are device values
    def device_strings(fn: cst.FunctionDef) -> bool:
        values = returns.get(fn, [])
        return bool(values) and fn not in generators and any(v is not None and is_cuda_string(v) for v in values) \
            and all(v is not None and (is_cuda_string(v) or is_string(v, *_OTHER_DEVICES)) for v in values)

    live = {key for key, fn in functions.items()
            if device_strings(fn) and called.get(key) and len(called[key]) == len(uses.get(key, []))}
    call_of = {id(call): key for key in live for call, _, _ in called[key]}
    while True:
        out, qualified = _device_variables(bindings, uses, order, ctx, lambda v: call_of.get(id(v)) in live)
        failed = {key for key in live if any(
            kind == OTHER_USE and not set(bound_by.get(id(call), [None])) <= qualified for call, kind, _ in called[key])}
        if not failed:
            break
        live -= failed
    for key in live:
        for value in returns[functions[key]]:
            if value is not None and is_cuda_string(value):
                out[value] = DEVICE_VALUE
        for _, _, literals in called[key]:
            out.update({lit: DEVICE_TEST for lit in literals})
    return out


def _follow_device_parameters(uses: dict, passed: dict, functions: dict, bindings: dict, resolve) -> None:
    """A read passed to a function of the file (``train(model, device)``) whose parameter the
    function reads only as a device, or as text, or passes on to such a parameter (and never
    rebinds) is a device use: ``uses`` is updated in place."""
    def parameter(read: cst.Name) -> Optional[tuple]:
        chain, name, where = passed[id(read)]
        fn = functions.get(resolve(chain, name))
        if fn is None:
            return None
        plain = [*fn.params.posonly_params, *fn.params.params]
        if isinstance(where, int):
            param = plain[where] if where < len(plain) else None
        else:
            param = next((q for q in [*plain, *fn.params.kwonly_params] if q.name.value == where), None)
        return (fn, param.name.value) if param is not None else None

    targets = {id(read): parameter(read) for key in uses for read, _, _ in uses[key] if id(read) in passed}
    devices = {key for key, reads in uses.items() if isinstance(key[0], cst.FunctionDef)
               and bindings.get(key) == [None] and reads}
    while True:
        failed = {key for key in devices if any(
            not (kind in ("device", "text") or targets.get(id(read)) in devices) for read, kind, _ in uses[key])}
        if not failed:
            break
        devices -= failed
    for key, reads in uses.items():
        uses[key] = [(read, "device" if kind == OTHER_USE and targets.get(id(read)) in devices else kind, literals)
                     for read, kind, literals in reads]


def returned(value: Optional[cst.BaseExpression]) -> list[Optional[cst.BaseExpression]]:
    """The values a ``return`` gives: the arms of a conditional expression, each."""
    if isinstance(value, cst.IfExp):
        return [*returned(value.body), *returned(value.orelse)]
    return [value]


def _device_variables(bindings: dict, uses: dict, order: dict, ctx: FileContext, device_call) -> tuple[dict, set]:
    """(the fact for the variables, the keys of the variables read only as devices); a call
    for which ``device_call`` is true is a device string value (a device function's)."""
    def device_value(v: Optional[cst.BaseExpression]) -> bool:
        return v is not None and (is_cuda_string(v) or is_string(v, *_OTHER_DEVICES) or isinstance(v, cst.Integer)
                                  or (isinstance(v, cst.Call) and (ctx.qualname(v.func) == "torch.device"
                                                                   or device_call(v))))

    out: dict = {}
    qualified: set = set()
    for key, values in bindings.items():
        if not all(device_value(v) for v in values):
            continue
        read = _as_device_objects(uses.get(key, []), values, order, ctx)
        if not any(is_cuda_string(v) or is_string(v, "xla") or (isinstance(v, cst.Call) and device_call(v))
                   for v in values):
            # CUDA numbers (`device = 0`): a device where the file reads it as one and in no other way
            ordinals = [v for v in values if isinstance(v, cst.Integer)]
            if ordinals and any(kind == "device" for _, kind, _ in read) \
                    and all(kind in ("device", "text") for _, kind, _ in read):
                out.update({v: DEVICE_VALUE for v in ordinals})
                out.update({node: DEVICE_READ for node, _, _ in read})
            continue
        ported = all(is_string(v, "xla") for v in values)  # (a test for 'cuda' of it is always false)
        if read and (ported or all(kind != OTHER_USE for _, kind, _ in read)):
            qualified.add(key)
            for v in values:
                if is_cuda_string(v) or isinstance(v, cst.Integer):
                    out[v] = DEVICE_VALUE
            out.update({node: DEVICE_READ for node, _, _ in read})
            for _, _, literals in read:
                for lit in literals:
                    out[lit] = DEVICE_TEST
        elif any(is_cuda_string(v) for v in values):
            for node, kind, _ in read:
                if kind == OTHER_USE:
                    out[node] = OTHER_USE
    return out, qualified


def _as_device_objects(read: list, values: list, order: dict, ctx: FileContext) -> list:
    """``read`` with the reads that follow the variable's last binding, where that binding is a
    ``torch.device(...)`` (``device = 'cuda' if args.cuda else 'cpu'`` then ``device =
    torch.device(device)``), counted as device uses: they read a torch.device, which the program
    may pass on as it would any other (``train(model, device, loader)``)."""
    last = max((v for v in values if v is not None), key=lambda v: order.get(id(v), -1), default=None)
    if not (isinstance(last, cst.Call) and ctx.qualname(last.func) == "torch.device") or None in values:
        return read
    after = order.get(id(last), len(order))
    return [(node, "device" if kind == OTHER_USE and order.get(id(node), -1) > after else kind, literals)
            for node, kind, literals in read]


def _params(params: cst.Parameters, chain: tuple, inner: tuple, bind, visit, stack) -> None:
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            every.append(star)
    for p in every:
        bind(inner, p.name.value, None)
        if p.default is not None:
            visit(p.default, chain, stack)
        if p.annotation is not None:
            visit(p.annotation, chain, stack)


def device_string_fact(ctx: FileContext) -> dict:
    """Node -> DEVICE_VALUE / DEVICE_TEST / OTHER_USE (see the module's docstring)."""
    return module_fact(ctx, _walk)


def xla_string(like: cst.CSTNode) -> cst.SimpleString:
    """``'xla'`` in the quotes of the string it replaces."""
    return device_string("xla", like)
