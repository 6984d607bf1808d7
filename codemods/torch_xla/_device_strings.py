"""Device strings kept in variables: ``device = 'cuda'`` (a script's configuration value that a
configurator or ``--device=`` may override) and how the file reads each such variable.

A variable is *a device string* when every binding of it in its scope is a CUDA device string
(``'cuda'``, ``'cuda:0'``, ``f'cuda:{rank}'``) or ``'xla'``. Each read of it is one of:

* a device use: the first argument of ``torch.device(...)``, ``.to(...)``,
  ``torch.cuda.set_device(...)``, ``torch.cuda.device(...)``; ``device=`` of a torch function or
  of a tensor's ``new_*``/``.to`` method; ``map_location=`` of ``torch.load``;
* a device-type test: compared with string literals (``device == 'cuda'``, ``'cuda' in device``,
  ``device in ('cuda', 'mps')``, ``device.startswith('cuda')``); its CUDA literals are the ones a
  port tests as ``'xla'``;
* text: an argument of ``print(...)`` or a value formatted into an f-string (only the printed
  text changes with the value);
* anything else (passed to a function of the program, stored in a structure, returned,
  assigned on): porter cannot tell what it does with the string.

The fact maps nodes to what they are, so that a rule asks about the node it visits:
``DEVICE_VALUE`` for a binding's CUDA string of a variable all of whose reads are device uses,
tests or text (and that the file reads at least once: a module-level name nobody reads here
may be imported by another file); ``DEVICE_TEST`` for a CUDA literal in a device-type test of
such a variable; ``OTHER_USE`` for a read of a device string variable (with a CUDA binding)
that is none of those, the reason its binding stays.
"""
from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.astutil import arg, children, code, string_value, target_names
from porter.context import FileContext
from porter.rules import module_fact

from ._tables import NAMESPACE_FUNCTIONS, is_cuda_string, is_string

DEVICE_VALUE = "value"
DEVICE_TEST = "test"
OTHER_USE = "other"

# Tensor methods whose `device=` places the result (and `.to`).
_PLACING_METHODS = ("to", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor")
_FIRST_ARG_DEVICE = ("torch.device", "torch.cuda.set_device", "torch.cuda.device")
_LOADERS = ("torch_xla.distributed.parallel_loader.MpDeviceLoader",)  # (loader, device)

_Scope = Optional[cst.CSTNode]  # a FunctionDef, Lambda or ClassDef; None: the module


def _walk(ctx: FileContext) -> dict:
    bindings: dict[tuple[_Scope, str], list[Optional[cst.BaseExpression]]] = {}
    reads: list[tuple[tuple, str, cst.Name, str, tuple]] = []

    def bind(chain: tuple, name: Optional[str], value: Optional[cst.BaseExpression]) -> None:
        if name is not None:
            bindings.setdefault((chain[-1] if chain else None, name), []).append(value)

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
            kind, literals = _classify(n, stack, ctx)
            reads.append((chain, n.value, n, kind, literals))
            return
        if isinstance(n, cst.Assign):
            for t in n.targets:
                if isinstance(t.target, cst.Name):
                    bind(chain, t.target.value, n.value)
                else:
                    unknown(chain, t.target)
            visit(n.value, chain, stack)
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
    out: dict = {}
    for key, values in bindings.items():
        if not values or any(v is None or not (is_cuda_string(v) or is_string(v, "xla")) for v in values):
            continue
        read = uses.get(key, [])
        ported = all(is_string(v, "xla") for v in values)  # (a test for 'cuda' of it is always false)
        if read and (ported or all(kind != OTHER_USE for _, kind, _ in read)):
            for v in values:
                if is_cuda_string(v):
                    out[v] = DEVICE_VALUE
            for _, _, literals in read:
                for lit in literals:
                    out[lit] = DEVICE_TEST
        elif any(is_cuda_string(v) for v in values):
            for node, kind, _ in read:
                if kind == OTHER_USE:
                    out[node] = OTHER_USE
    return out


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


def _classify(name: cst.Name, stack: list, ctx: FileContext) -> tuple[str, tuple]:
    """What the read ``name`` (the last of ``stack``, its ancestors before it) does with the value."""
    parent = stack[-2] if len(stack) >= 2 else None
    grand = stack[-3] if len(stack) >= 3 else None
    if isinstance(parent, cst.Arg) and parent.value is name and isinstance(grand, cst.Call):
        call = grand
        keyword = parent.keyword.value if parent.keyword is not None else None
        qual = ctx.qualname(call.func) or ""
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        if keyword is None and call.args and call.args[0] is parent:
            if qual in _FIRST_ARG_DEVICE or (method == "to" and not qual.startswith("torch.")):
                return "device", ()
        if keyword is None and len(call.args) > 1 and call.args[1] is parent and qual in _LOADERS:
            return "device", ()
        if keyword == "device" and (qual.startswith(("torch.", "torch_xla.")) or (method in _PLACING_METHODS and not qual)):
            return "device", ()
        if keyword == "map_location" and qual == "torch.load":
            return "device", ()
        if qual == "builtins.print":
            return "text", ()
        return OTHER_USE, ()
    if isinstance(parent, cst.FormattedStringExpression) and parent.expression is name:
        return "text", ()
    comparison = parent if isinstance(parent, cst.Comparison) else grand if isinstance(parent, cst.ComparisonTarget) else None
    if isinstance(comparison, cst.Comparison):
        literals = _test_literals(comparison, name)
        return ("test", literals) if literals is not None else (OTHER_USE, ())
    if isinstance(parent, cst.Attribute) and parent.value is name and parent.attr.value in ("startswith", "endswith") \
            and isinstance(grand, cst.Call) and grand.func is parent and len(grand.args) == 1 \
            and grand.args[0].keyword is None and string_value(grand.args[0].value) is not None:
        first = grand.args[0].value
        return "test", ((first,) if is_cuda_string(first) or string_value(first) == "cuda" else ())
    return OTHER_USE, ()


def _test_literals(comparison: cst.Comparison, name: cst.Name) -> Optional[tuple]:
    """The CUDA literals ``name`` is tested against in ``comparison`` (equality, membership in
    a tuple of strings, a substring test), or None where it is compared with anything else."""
    operands = [comparison.left, *(c.comparator for c in comparison.comparisons)]
    ops = [c.operator for c in comparison.comparisons]
    found: list = []
    for i, op in enumerate(ops):
        left, right = operands[i], operands[i + 1]
        if left is not name and right is not name:
            continue
        other = right if left is name else left
        if isinstance(op, (cst.Equal, cst.NotEqual)) or (isinstance(op, (cst.In, cst.NotIn)) and right is name):
            strings = [other]
        elif isinstance(op, (cst.In, cst.NotIn)) and isinstance(other, (cst.Tuple, cst.List, cst.Set)):
            strings = [e.value for e in other.elements]
        else:
            return None
        if not strings or any(string_value(s) is None for s in strings):
            return None
        found.extend(s for s in strings if is_cuda_string(s))
    return tuple(found)


def device_string_fact(ctx: FileContext) -> dict:
    """Node -> DEVICE_VALUE / DEVICE_TEST / OTHER_USE (see the module's docstring)."""
    return module_fact(ctx, _walk)


def xla_string(like: cst.CSTNode) -> cst.SimpleString:
    """``'xla'`` in the quotes of the string it replaces."""
    quote = '"'
    if isinstance(like, cst.SimpleString) and like.quote in ('"', "'"):
        quote = like.quote
    elif isinstance(like, cst.FormattedString) and like.end in ('"', "'"):
        quote = like.end
    return cst.SimpleString(f"{quote}xla{quote}")


# --------------------------------------------------------------------------------------
# A command-line option whose default is a CUDA device string
# --------------------------------------------------------------------------------------
# ``parser.add_argument('--device', default='cuda')`` (on a parser or an argument group): the
# option is *placement only* when every read of it that the file shows is a device use or text
# (as above; a device-type test is not: the port would keep the option's CUDA spelling in it),
# the namespace that holds it is followed from ``parse_args()`` through assignments, returns and
# the parameters of the file's functions, and every other use of the whole namespace is one of
# NAMESPACE_FUNCTIONS (a device setup that accepts 'xla', a function that reads other options,
# a record). Anything else (``getattr(args, ...)``, ``vars(args)`` handed to code porter does
# not know, the namespace stored or passed to a method) may read the option: not provable.

_PARSE_CALLS = ("parse_args", "parse_intermixed_args")
_PARSE_KNOWN = ("parse_known_args", "parse_known_intermixed_args")
_QUOTE = 60


def option_dest(call: cst.Call) -> Optional[str]:
    """The namespace attribute that ``add_argument(...)`` sets, by argparse's rule: ``dest=``,
    else the first long option string, else the first option string, without the leading
    dashes and with '-' as '_' (a positional argument: its name). None where not literal."""
    dest = arg(call, "dest")
    if dest is not None:
        return string_value(dest.value)
    strings = []
    for a in call.args:
        if a.keyword is not None or a.star:
            break
        value = string_value(a.value)
        if value is None:
            return None
        strings.append(value)
    if not strings:
        return None
    if not strings[0].startswith("-"):
        return strings[0]
    chosen = next((s for s in strings if s.startswith("--")), strings[0])
    return chosen.lstrip("-").replace("-", "_")


def _quote(node: cst.CSTNode) -> str:
    text = " ".join(code(node).split())
    return text if len(text) <= _QUOTE else text[:_QUOTE - 3] + "..."


_INSIDE_EXPRESSIONS = (cst.BaseExpression, cst.Arg, cst.ComparisonTarget, cst.BaseElement, cst.BaseDictElement,
                       cst.FormattedStringExpression, cst.Index, cst.SubscriptElement)


def _context(stack: list) -> cst.CSTNode:
    """The read ``stack[-1]`` with what it is read in: the whole expression, or the small
    statement it is part of (``on_gpu = args.device.startswith('cuda')``)."""
    i = len(stack) - 1
    while i > 0 and isinstance(stack[i - 1], _INSIDE_EXPRESSIONS):
        i -= 1
    while i < len(stack) - 1 and not isinstance(stack[i], cst.BaseExpression):
        i += 1
    if i > 0 and isinstance(stack[i - 1], cst.BaseSmallStatement):
        return stack[i - 1]
    return stack[i]


def _is_store(node: cst.CSTNode, stack: list) -> bool:
    parent = stack[-2] if len(stack) >= 2 else None
    if isinstance(parent, (cst.Param, cst.FunctionDef, cst.ClassDef, cst.ImportAlias, cst.NameItem, cst.AsName)):
        return True
    if isinstance(parent, cst.Attribute) and parent.attr is node:
        return True
    if isinstance(parent, cst.Arg) and parent.keyword is node:
        return True
    if isinstance(parent, (cst.AssignTarget, cst.For, cst.CompFor)) and parent.target is node:
        return True
    if isinstance(parent, cst.Element) and len(stack) >= 4 and isinstance(stack[-3], (cst.Tuple, cst.List)) \
            and isinstance(stack[-4], (cst.AssignTarget, cst.For, cst.CompFor)) and stack[-4].target is stack[-3]:
        return True
    return False


def _bound_param(fn: cst.FunctionDef, call: cst.Call, given: cst.Arg) -> Optional[str]:
    """The parameter of ``fn`` that ``given`` (an argument of ``call``) binds, None where it
    goes to ``*args``/``**kwargs`` or an earlier argument is unpacked."""
    positional = [*fn.params.posonly_params, *fn.params.params]
    if given.keyword is None:
        index = 0
        for a in call.args:
            if a is given:
                break
            if a.star:
                return None
            if a.keyword is None:
                index += 1
        return positional[index].name.value if index < len(positional) else None
    named = [*fn.params.params, *fn.params.kwonly_params]
    return given.keyword.value if any(p.name.value == given.keyword.value for p in named) else None


def _option_walk(ctx: FileContext) -> dict:
    options: dict[str, list] = {}  # dest -> [(add_argument call, default node)]
    occurrences: dict[str, list] = {}  # name -> [(Name node, ancestors, enclosing function)]
    local_calls: dict[str, list] = {}  # module-level function name -> [(Call, ancestors)]
    functions: dict[str, Optional[cst.FunctionDef]] = {}
    seeds: set[str] = set()
    parses: list = []  # parse calls whose result is used otherwise than assigned to a name
    blocked: list[str] = []  # whole-namespace uses that may read any option

    def visit(node: cst.CSTNode, stack: list, fn: Optional[cst.FunctionDef]) -> None:
        stack.append(node)
        if isinstance(node, cst.Name):
            occurrences.setdefault(node.value, []).append((node, list(stack), fn))
        elif isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value == "add_argument":
                default = arg(node, "default")
                dest = option_dest(node)
                if default is not None and is_cuda_string(default.value) and dest is not None:
                    options.setdefault(dest, []).append((node, default.value))
            elif isinstance(func, cst.Attribute) and func.attr.value in (*_PARSE_CALLS, *_PARSE_KNOWN):
                _seed(node, func.attr.value in _PARSE_KNOWN, stack, fn)
            elif isinstance(func, cst.Name):
                local_calls.setdefault(func.value, []).append((node, list(stack)))
        elif isinstance(node, cst.FunctionDef):
            if len(stack) == 2:  # a module-level function
                functions[node.name.value] = None if node.name.value in functions else node
            fn = node
        for child in children(node):
            visit(child, stack, fn)
        stack.pop()

    def _seed(call: cst.Call, known: bool, stack: list, fn: Optional[cst.FunctionDef]) -> None:
        parent = stack[-2] if len(stack) >= 2 else None
        if isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1:
            target = parent.targets[0].target
            if not known and isinstance(target, cst.Name):
                seeds.add(target.value)
                return
            if known and isinstance(target, (cst.Tuple, cst.List)) and target.elements \
                    and isinstance(target.elements[0].value, cst.Name):
                seeds.add(target.elements[0].value.value)
                return
        parses.append((call, known, list(stack), fn))

    visit(ctx.module, [], None)
    if not options:
        return {}
    dests = set(options)
    reads: dict[str, list[str]] = {d: [] for d in dests}
    namespaces: set[str] = set()
    work = list(seeds)
    if not seeds and not parses:
        blocked.append("no `parse_args()` in this file: the options are read elsewhere")

    def add(name: str) -> None:
        if name not in namespaces and name not in work:
            work.append(name)

    def whole(expr: cst.CSTNode, above: list, fn: Optional[cst.FunctionDef], as_dict: bool) -> None:
        """A use of the whole namespace ``expr`` (its ancestors: ``above``, innermost last)."""
        parent = above[-1] if above else None
        grand = above[-2] if len(above) >= 2 else None
        if isinstance(parent, cst.Arg) and parent.value is expr and isinstance(grand, cst.Call):
            qual = ctx.qualname(grand.func) or ""
            if not parent.star and not as_dict and qual == "builtins.vars" and len(grand.args) == 1:
                whole(grand, above[:-2], fn, True)
                return
            if not parent.star and qual in NAMESPACE_FUNCTIONS:
                return
            if not parent.star and not as_dict and qual in ("builtins.getattr", "builtins.setattr", "builtins.hasattr") \
                    and grand.args[0] is parent and len(grand.args) >= 2:
                attr = string_value(grand.args[1].value)
                if attr is not None and (attr not in dests or qual == "builtins.hasattr"):
                    return  # another option, by name
            if not parent.star and not as_dict and isinstance(grand.func, cst.Name) and functions.get(grand.func.value):
                param = _bound_param(functions[grand.func.value], grand, parent)
                if param is not None:
                    add(param)
                    return
            blocked.append(f"`{_quote(grand)}` gets the parsed options")
            return
        if isinstance(parent, cst.FormattedStringExpression):
            return
        if isinstance(parent, cst.Assign) and parent.value is expr and not as_dict and len(parent.targets) == 1 \
                and isinstance(parent.targets[0].target, cst.Name):
            add(parent.targets[0].target.value)
            return
        index: Optional[int] = None
        ret = None
        if isinstance(parent, cst.Return):
            ret = parent
        elif isinstance(parent, cst.Element) and isinstance(grand, cst.Tuple) and len(above) >= 3 \
                and isinstance(above[-3], cst.Return) and not isinstance(parent, cst.StarredElement):
            ret, index = above[-3], grand.elements.index(parent)
        if ret is not None and not as_dict and fn is not None and functions.get(fn.name.value) is fn:
            for call, stack in local_calls.get(fn.name.value, []):
                _returned(call, stack, index)
            return
        blocked.append(f"`{_quote(parent if parent is not None else expr)}`")

    def _returned(call: cst.Call, stack: list, index: Optional[int]) -> None:
        parent = stack[-2] if len(stack) >= 2 else None
        if isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1:
            target = parent.targets[0].target
            if index is None and isinstance(target, cst.Name):
                add(target.value)
                return
            if index is not None and isinstance(target, (cst.Tuple, cst.List)) \
                    and not any(isinstance(e, cst.StarredElement) for e in target.elements) \
                    and index < len(target.elements) and isinstance(target.elements[index].value, cst.Name):
                add(target.elements[index].value.value)
                return
        blocked.append(f"`{_quote(parent if parent is not None else call)}`, the namespace returned")

    for call, known, stack, fn in parses:
        if known:
            blocked.append(f"`{_quote(call)}`, whose namespace porter does not follow")
        else:
            whole(call, stack[:-1], fn, False)
    while work:
        name = work.pop()
        namespaces.add(name)
        for node, stack, fn in occurrences.get(name, []):
            if _is_store(node, stack):
                continue
            if fn is not None and any(isinstance(s, cst.Param) and s.name.value == name
                                      for s in (fn.params.star_arg, fn.params.star_kwarg)):
                continue  # `*args` of a function: another object
            parent = stack[-2] if len(stack) >= 2 else None
            if isinstance(parent, cst.Attribute) and parent.value is node:
                attr = parent.attr.value
                if attr in dests:
                    grand = stack[-3] if len(stack) >= 3 else None
                    if isinstance(grand, cst.AssignTarget) and grand.target is parent:
                        continue  # the option set anew
                    kind, _ = _classify(parent, stack[:-1], ctx)  # type: ignore[arg-type]
                    if kind not in ("device", "text"):
                        reads[attr].append(f"`{_quote(_context(stack[:-1]))}`")
                elif attr == "__dict__":
                    whole(parent, stack[:-2], fn, True)
                continue
            whole(node, stack[:-1], fn, False)

    out: dict = {}
    for dest, found in options.items():
        for call, default in found:
            choices = arg(call, "choices")
            reasons = [*reads[dest], *blocked]
            if choices is not None and "'xla'" not in code(choices) and '"xla"' not in code(choices):
                reasons.insert(0, f"`choices={_quote(choices.value)}` has no 'xla'")
            out[default] = reasons[0] if reasons else ""
    return out


def option_default_fact(ctx: FileContext) -> dict:
    """``add_argument``'s CUDA ``default=`` node -> "" where every read of the option is a
    device use or text, else the first read (or use of the namespace) that is not, quoted."""
    return module_fact(ctx, _option_walk)
