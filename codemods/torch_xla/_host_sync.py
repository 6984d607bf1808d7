"""Shared helpers of the host-sync (TX4xx) and static-shape (TX5xx) rules.

Everything here is pure and syntactic: which loop a node runs in, which names a loop rebinds,
which names an expression reads, and how a value read in a loop is used (is it only formatted,
or does it flow somewhere a tensor would behave differently from a Python number).
"""
from __future__ import annotations

import re
from typing import Iterator, Optional

import libcst as cst

from porter.astutil import children as _children
from porter.astutil import target_names

from porter.astutil import method_name, walk
from porter.context import FileContext, dotted_name

from . import _training

SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
LOOPS = (cst.For, cst.While)

# Methods that copy a tensor's value to the host.
HOST_READ_METHODS = ("item", "tolist", "cpu", "numpy")
# Tensor methods whose result is a tensor holding data (not a shape): a Python `if` or a
# shape built from them reads the device.
VALUE_METHODS = (
    "item", "any", "all", "sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin",
    "norm", "prod", "isnan", "isinf", "isfinite", "eq", "ne", "gt", "lt", "ge", "le",
    "equal", "allclose", "isclose", "count_nonzero", "tolist",
)
# Methods producing a bool tensor.
BOOL_METHODS = ("eq", "ne", "gt", "lt", "ge", "le", "isnan", "isinf", "isfinite", "isclose", "bool",
                "logical_and", "logical_or", "logical_not", "logical_xor")
BOOL_FUNCTIONS = tuple(f"torch.{m}" for m in BOOL_METHODS if m != "bool")


# --------------------------------------------------------------------------------------
# Where a node runs
# --------------------------------------------------------------------------------------
def step_loop(ctx: FileContext) -> Optional[cst.CSTNode]:
    """The innermost train/eval loop around the current node, without crossing a function,
    lambda or class: the code of one training/evaluation step. Loops are classified as the
    loop rules (TX202, TX301) do (``_training.loop_kind``: the loop doing the step itself,
    not an epoch loop around it)."""
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, SCOPES):
            return None
        if isinstance(anc, LOOPS) and is_step_loop(anc, ctx):
            return anc
    return None


def is_step_loop(loop: cst.CSTNode, ctx: FileContext) -> bool:
    return per_loop(ctx, "step", loop, lambda: _training.loop_kind(loop, ctx) is not None)


def per_loop(ctx: FileContext, what: str, loop: cst.CSTNode, compute):
    """``compute()`` once per loop and traversal: facts that walk a loop's body (its kind,
    the tensors it names) are asked for at many nodes inside it. They depend only on the
    loop and what encloses it, so they are cached on this traversal's context."""
    cache = ctx.cache
    key = (what, loop)
    if key not in cache:
        cache[key] = compute()
    return cache[key]


def syncs_each_step(loop: cst.CSTNode, ctx: FileContext) -> bool:
    """Whether every iteration of ``loop`` ends in a step marker: ``torch_xla.sync()`` (or
    ``xm.mark_step()``, ``xm.optimizer_step(opt, barrier=True)``) in its body, or a device
    loader (``pl.MpDeviceLoader``) as what it iterates. Step closures run at that marker."""
    if _training.has_step_marker(loop, ctx):
        return True
    if isinstance(loop, cst.For):
        return any(s.kind == _training.DEVICE_LOADER for s in _training.loop_source(loop, ctx))
    return False


def enclosing_scope(ctx: FileContext) -> cst.CSTNode:
    """The function (or the module) whose body holds the current node."""
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, cst.FunctionDef):
            return anc
    return ctx.module


def outermost_loop(ctx: FileContext) -> Optional[cst.CSTNode]:
    """The outermost for/while loop around the current node within its function."""
    found = None
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, SCOPES):
            break
        if isinstance(anc, LOOPS):
            found = anc
    return found


def under(ctx: FileContext, kind: type, field: str) -> Optional[cst.CSTNode]:
    """The nearest ancestor of type ``kind`` whose ``field`` contains the current node."""
    stack = ctx.ancestors
    for i in range(len(stack) - 2, -1, -1):
        anc = stack[i]
        if isinstance(anc, SCOPES):
            return None
        if isinstance(anc, kind) and getattr(anc, field, None) is stack[i + 1]:
            return anc
    return None


# --------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------
def bound_names(node: cst.CSTNode) -> set[str]:
    """Names (re)bound anywhere inside ``node``, itself included, not inside nested scopes."""
    names: set[str] = set()
    for n in walk(node):
        if isinstance(n, cst.Assign):
            for t in n.targets:
                names.update(target_names(t.target))
        elif isinstance(n, (cst.AugAssign, cst.AnnAssign)):
            names.update(target_names(n.target))
        elif isinstance(n, cst.For):
            names.update(target_names(n.target))
        elif isinstance(n, cst.NamedExpr):
            names.update(target_names(n.target))
        elif isinstance(n, cst.WithItem) and n.asname is not None:
            names.update(target_names(n.asname.name))
        elif isinstance(n, cst.ExceptHandler) and n.name is not None:
            names.update(target_names(n.name.name))
    return names


def parent_map(root: cst.CSTNode) -> dict[int, cst.CSTNode]:
    parents: dict[int, cst.CSTNode] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        for child in _children(node):
            parents[id(child)] = node
            stack.append(child)
    return parents


def _is_load(name: cst.Name, parent: Optional[cst.CSTNode]) -> bool:
    if isinstance(parent, cst.Attribute) and parent.attr is name:
        return False
    if isinstance(parent, (cst.Arg, cst.Param)) and (getattr(parent, "keyword", None) is name or getattr(parent, "name", None) is name):
        return False
    if isinstance(parent, cst.AssignTarget) and parent.target is name:
        return False
    if isinstance(parent, (cst.For, cst.CompFor, cst.NamedExpr)) and parent.target is name:
        return False
    if isinstance(parent, cst.AnnAssign) and parent.target is name:
        return False
    if isinstance(parent, (cst.AsName, cst.ImportAlias, cst.FunctionDef, cst.ClassDef)):
        return False
    return True  # names inside unpacking targets count as reads too (conservative)


def loads(root: cst.CSTNode, name: str, parents: Optional[dict[int, cst.CSTNode]] = None) -> list[cst.Name]:
    """Every read of ``name`` inside ``root`` (nested functions and lambdas included)."""
    parents = parents if parents is not None else parent_map(root)
    out = []
    for n in walk(root, into_functions=True):
        if isinstance(n, cst.Name) and n.value == name and _is_load(n, parents.get(id(n))):
            out.append(n)
    return out


def free_reads(expr: cst.CSTNode) -> list[str]:
    """Names an expression reads from its surroundings, in order of first appearance
    (names bound inside it by lambdas, comprehensions or ``:=`` are left out)."""
    local: set[str] = set()
    for n in walk(expr, into_functions=True):
        if isinstance(n, cst.Lambda):
            local.update(p.name.value for p in n.params.params)
            local.update(p.name.value for p in n.params.kwonly_params)
            local.update(p.name.value for p in n.params.posonly_params)
        elif isinstance(n, (cst.CompFor, cst.NamedExpr)):
            local.update(target_names(n.target))
    parents = parent_map(expr)
    seen: list[str] = []
    for n in _in_source_order(expr):
        if isinstance(n, cst.Name) and n.value not in local and n.value not in seen and _is_load(n, parents.get(id(n))):
            seen.append(n.value)
    return seen


def _in_source_order(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in _children(node):
        yield from _in_source_order(child)


# --------------------------------------------------------------------------------------
# What a node reads
# --------------------------------------------------------------------------------------
def calls_to(node: cst.CSTNode, methods: tuple[str, ...], into_functions: bool = False) -> list[cst.Call]:
    """Calls ``x.m()`` with ``m`` in ``methods`` below ``node``."""
    return [n for n in walk(node, into_functions) if isinstance(n, cst.Call) and method_name(n) in methods]


def backward_receivers(loop: cst.CSTNode) -> set[str]:
    """Names on which the loop calls ``.backward()``: the loss tensors of the step."""
    names = set()
    for call in calls_to(loop, ("backward",)):
        recv = call.func.value  # type: ignore[attr-defined]
        if isinstance(recv, cst.Name):
            names.add(recv.value)
    return names


def device_names(loop: cst.CSTNode) -> set[str]:
    """Names that hold tensors in the step as far as porter can tell: the losses
    (``.backward()`` receivers), names assigned ``<expr>.detach()`` (what TX405 writes),
    running sums of such values (``total += loss.detach()``, what TX401 writes), and names
    computed from those by arithmetic (``cur_loss = total / log_interval``)."""
    names = backward_receivers(loop)
    assigns = [n for n in walk(loop) if isinstance(n, (cst.Assign, cst.AugAssign))]
    for _ in range(4):
        before = len(names)
        for n in assigns:
            if isinstance(n, cst.Assign):
                if len(n.targets) != 1 or not isinstance(n.targets[0].target, cst.Name):
                    continue
                target = n.targets[0].target.value
            elif isinstance(n.target, cst.Name) and isinstance(n.operator, cst.AddAssign):
                target = n.target.value
            else:
                continue
            if _device_value(n.value, names, isinstance(n, cst.AugAssign)):
                names.add(target)
        if len(names) == before:
            break
    return names


def _device_value(value: cst.CSTNode, names: set[str], summed: bool) -> bool:
    if isinstance(value, cst.Call) and method_name(value) == "detach":
        return True
    if summed and calls_to(value, ("detach",)):
        return True
    if isinstance(value, (cst.BinaryOperation, cst.UnaryOperation)):
        return any(isinstance(n, cst.Name) and n.value in names for n in walk(value))
    return False


def loop_losses(ctx: FileContext, loop: cst.CSTNode) -> set[str]:
    return per_loop(ctx, "losses", loop, lambda: backward_receivers(loop))


def loop_tensors(ctx: FileContext, loop: cst.CSTNode) -> set[str]:
    return per_loop(ctx, "tensors", loop, lambda: device_names(loop))


def reads_tensor_value(expr: cst.CSTNode, ctx: FileContext, tensors: set[str] = frozenset()) -> bool:
    """Whether evaluating ``expr`` needs a tensor's value on the host: a host-read method
    (``.item()``, ``.tolist()``...), a data reduction (``.sum()``, ``.any()``...), a ``torch.*``
    function producing data, or a name known to be a tensor (``tensors``) used as a value."""
    parents = None
    for n in walk(expr):
        if isinstance(n, cst.Call):
            q = ctx.qualname(n.func) or ""
            if q:  # a module's function: torch's data functions read values, numpy's do not
                if q.startswith("torch.") and q.rsplit(".", 1)[-1] in VALUE_METHODS + BOOL_METHODS:
                    return True
                continue
            m = method_name(n)
            if m in VALUE_METHODS or m in HOST_READ_METHODS:
                return True
        elif isinstance(n, cst.Name) and n.value in tensors:
            parents = parents or parent_map(expr)
            if _used_as_value(n, parents, ctx):
                return True
    return False


_STATIC_ATTRS = ("shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "grad_fn", "size", "dim", "numel")


def _used_as_value(name: cst.Name, parents: dict[int, cst.CSTNode], ctx: FileContext) -> bool:
    p = parents.get(id(name))
    if not _is_load(name, p):
        return False
    if isinstance(p, cst.Attribute) and p.value is name and p.attr.value in _STATIC_ATTRS:
        return False
    if isinstance(p, cst.Arg):
        call = parents.get(id(p))
        if isinstance(call, cst.Call) and ctx.qualname(call.func) in ("builtins.len", "builtins.isinstance", "builtins.type", "builtins.id"):
            return False
    return True


def is_bool_tensor_expr(expr: cst.CSTNode, ctx: FileContext) -> bool:
    """A comparison, a bool-producing tensor method/function, or ``~``/``&``/``|`` of those."""
    if isinstance(expr, cst.Comparison):
        return all(not isinstance(t.operator, (cst.In, cst.NotIn, cst.Is, cst.IsNot)) for t in expr.comparisons)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.BitInvert):
        return is_bool_tensor_expr(expr.expression, ctx)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
        return is_bool_tensor_expr(expr.left, ctx) or is_bool_tensor_expr(expr.right, ctx)
    if isinstance(expr, cst.Call):
        if method_name(expr) in BOOL_METHODS:
            return True
        return (ctx.qualname(expr.func) or "") in BOOL_FUNCTIONS
    return False


def mask_of(mask: cst.CSTNode, x: cst.CSTNode, ctx: FileContext) -> bool:
    """Whether ``mask`` is built from ``x`` itself by elementwise comparisons/predicates, so
    that it has exactly ``x``'s shape (``x > 0``, ``~torch.isnan(x)``, ``(x > a) & (x < b)``)."""
    if isinstance(mask, cst.Comparison):
        if not is_bool_tensor_expr(mask, ctx) or len(mask.comparisons) != 1:
            return False
        other = mask.comparisons[0].comparator
        if mask.left.deep_equals(x):
            return _is_scalar(other)
        if other.deep_equals(x):
            return _is_scalar(mask.left)
        return False
    if isinstance(mask, cst.UnaryOperation) and isinstance(mask.operator, cst.BitInvert):
        return mask_of(mask.expression, x, ctx)
    if isinstance(mask, cst.BinaryOperation) and isinstance(mask.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
        return mask_of(mask.left, x, ctx) and mask_of(mask.right, x, ctx)
    if isinstance(mask, cst.Call):
        m = method_name(mask)
        if m in ("isnan", "isinf", "isfinite", "signbit") and not mask.args:
            return mask.func.value.deep_equals(x)  # type: ignore[attr-defined]
        if m in ("eq", "ne", "gt", "lt", "ge", "le") and len(mask.args) == 1:
            return mask.func.value.deep_equals(x) and _is_scalar(mask.args[0].value)  # type: ignore[attr-defined]
        q = ctx.qualname(mask.func) or ""
        if q in ("torch.isnan", "torch.isinf", "torch.isfinite", "torch.signbit") and len(mask.args) == 1:
            return mask.args[0].value.deep_equals(x)
    return False


def _is_scalar(node: cst.CSTNode) -> bool:
    """A Python number literal (possibly negated) or a plain name (a hyper-parameter or a
    0-dim value; a comparison with a bigger tensor would make ``x[mask]`` fail anyway)."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float, cst.Name))


def is_number_literal(node: cst.CSTNode, ctx: FileContext) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
        node = node.expression
    if isinstance(node, (cst.Integer, cst.Float)):
        return True
    if isinstance(node, cst.Call) and ctx.qualname(node.func) == "builtins.float" and len(node.args) == 1:
        return isinstance(node.args[0].value, cst.SimpleString)
    return ctx.qualname(node) in ("math.inf", "math.pi", "math.e", "math.nan")


# --------------------------------------------------------------------------------------
# Statements the TX4xx rules own
# --------------------------------------------------------------------------------------
_LOG_METHODS = ("debug", "info", "warning", "warn", "error", "critical", "exception", "log")
_PROGRESS_METHODS = ("set_postfix", "set_postfix_str", "set_description", "set_description_str")
_SCALAR_METHODS = ("add_scalar", "add_scalars")


def is_logging_call(call: cst.Call, ctx: FileContext) -> bool:
    """``print(...)``, ``logger.info(...)``/``logging.info(...)``, a tqdm bar's
    ``set_postfix``/``set_description``, ``tqdm.write``, TensorBoard's ``add_scalar``,
    ``wandb.log``."""
    q = ctx.qualname(call.func) or ""
    if q in ("builtins.print", "wandb.log", "tqdm.tqdm.write", "tqdm.write", "tqdm.auto.tqdm.write"):
        return True
    m = method_name(call)
    if m in _PROGRESS_METHODS or m in _SCALAR_METHODS:
        return True
    if m in _LOG_METHODS:
        receiver = dotted_name(call.func.value) or ""  # type: ignore[attr-defined]
        return "log" in receiver.rsplit(".", 1)[-1].lower()
    return False


def in_logging_statement(ctx: FileContext) -> bool:
    """Whether the current node is inside a logging call that is a statement of its own
    (TX402 moves those into a step closure)."""
    stack = ctx.ancestors
    for i in range(len(stack) - 2, 0, -1):
        anc = stack[i]
        if isinstance(anc, SCOPES):
            return False
        if isinstance(anc, cst.Call) and isinstance(stack[i - 1], cst.Expr) and is_logging_call(anc, ctx):
            return True
    return False


def in_test(ctx: FileContext) -> Optional[cst.CSTNode]:
    """The if/elif/while/assert/conditional expression whose condition holds the current node."""
    for kind in (cst.If, cst.While, cst.IfExp, cst.Assert):
        found = under(ctx, kind, "test")
        if found is not None:
            return found
    return None


def logged_scalar(ctx: FileContext, call: cst.Call) -> Optional[tuple[cst.Assign, "ReadChecker"]]:
    """``name = <expr>.item()`` in the step, where ``name`` is read only in the loop and only
    by reads a 0-dim tensor serves alike (formatting, ``math.*``): TX405 keeps it on the device.
    Returns the assignment and the checker that accepted its reads."""
    if method_name(call) != "item" or call.args:
        return None
    assign = ctx.parent
    if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1):
        return None
    target = assign.targets[0].target
    if not isinstance(target, cst.Name):
        return None
    loop = step_loop(ctx)
    if loop is None:
        return None
    scope = enclosing_scope(ctx)
    if read_outside(scope, loop, target.value):
        return None
    checker = ReadChecker(ctx, loop, scope)
    if not checker.name_reads_safe(target.value, loop):
        return None
    return assign, checker


def is_host_sum(node: cst.AugAssign) -> bool:
    """`name += <expr with .item()>`: a running sum kept on the host (TX401)."""
    return (
        isinstance(node.operator, cst.AddAssign)
        and isinstance(node.target, cst.Name)
        and any(not c.args for c in calls_to(node.value, ("item",)))
    )


# --------------------------------------------------------------------------------------
# How a value is used (the running-metric rule)
# --------------------------------------------------------------------------------------
_ARITH = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Power)
_PERCENT = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?(.)")
_NUMERIC_PERCENT = set("diueEfFgG%")


def percent_is_numeric(fmt: cst.CSTNode) -> bool:
    """A %-format string whose conversions all read numbers (``%5.2f``, ``%d``), never
    ``%s``/``%r`` (those would print ``tensor(...)`` instead of the number)."""
    if not isinstance(fmt, cst.SimpleString):
        return False
    try:
        text = fmt.evaluated_value
    except Exception:
        return False
    return isinstance(text, str) and all(c in _NUMERIC_PERCENT for c in _PERCENT.findall(text))


def is_format_call(call: cst.CSTNode) -> bool:
    return (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "format"
        and isinstance(call.func.value, (cst.SimpleString, cst.ConcatenatedString))
    )


class ReadChecker:
    """Decides whether every read of a name inside a loop behaves the same when the name holds
    a 0-dim tensor instead of a Python number: arithmetic on it, then formatting with a spec
    (f-strings, ``str.format``, numeric ``%``), ``math.*``, ``float()``/``int()``, or a name
    assigned from it and itself only read that way. Anything else (``print(x)``, ``str(x)``,
    ``round(x, 2)``, a comparison, a call of unknown code) is unsafe.
    """

    def __init__(self, ctx: FileContext, loop: cst.CSTNode, scope: cst.CSTNode) -> None:
        self.ctx = ctx
        self.loop = loop
        self.scope = scope
        self.parents = parent_map(scope)
        self.reason = ""
        self.computed = False  # some read does arithmetic on the value (float32 on the device)

    def name_reads_safe(self, name: str, within: cst.CSTNode, depth: int = 0) -> bool:
        for load in loads(within, name, self.parents):
            parent = self.parents.get(id(load))
            if isinstance(parent, cst.AugAssign) and parent.target is load:
                continue  # `acc += ...`, `acc /= n`: stays a tensor
            if not self.use_safe(load, depth):
                return False
        return True

    def use_safe(self, node: cst.CSTNode, depth: int) -> bool:
        cur = node
        while True:
            p = self.parents.get(id(cur))
            if isinstance(p, cst.BinaryOperation) and isinstance(p.operator, _ARITH):
                self.computed = True
                cur = p
            elif isinstance(p, cst.BinaryOperation) and isinstance(p.operator, cst.Modulo):
                if p.right is cur and percent_is_numeric(p.left):
                    return True
                if p.left is cur:
                    self.computed = True
                    cur = p
                else:
                    return self._fail(cur, "a %-format that is not numeric")
            elif isinstance(p, cst.UnaryOperation) and isinstance(p.operator, (cst.Minus, cst.Plus)):
                self.computed = True
                cur = p
            elif isinstance(p, cst.FormattedStringExpression) and p.expression is cur:
                return p.conversion is None or self._fail(cur, "an f-string with a !r/!s conversion")
            elif isinstance(p, cst.Arg):
                return self._arg_safe(p, depth)
            elif isinstance(p, cst.Element):
                return self._element_safe(p, cur, depth)
            elif isinstance(p, cst.Assign) and p.value is cur:
                return self._derived_safe(p, depth)
            elif isinstance(p, cst.ParenthesizedWhitespace):
                cur = p
            else:
                return self._fail(cur, "a use that a tensor would change")

    def _arg_safe(self, arg: cst.Arg, depth: int) -> bool:
        call = self.parents.get(id(arg))
        if not isinstance(call, cst.Call):
            return self._fail(arg, "an argument")
        if is_format_call(call) or self.ctx.qualname(call.func) in ("builtins.float", "builtins.int"):
            return True
        if (self.ctx.qualname(call.func) or "").startswith("math."):
            return True
        return self._fail(call, f"an argument of {dotted_name(call.func) or 'a call'}()")

    def _element_safe(self, element: cst.Element, cur: cst.CSTNode, depth: int) -> bool:
        seq = self.parents.get(id(element))
        holder = self.parents.get(id(seq))
        if isinstance(seq, cst.Tuple) and isinstance(holder, cst.BinaryOperation) and isinstance(holder.operator, cst.Modulo):
            if holder.right is seq and percent_is_numeric(holder.left):
                return True
        if isinstance(seq, cst.Tuple) and isinstance(holder, cst.Arg) and holder.keyword is not None and holder.keyword.value == "args":
            call = self.parents.get(id(holder))
            if isinstance(call, cst.Call) and self.ctx.qualname(call.func) == "torch_xla.core.xla_model.add_step_closure":
                fn = call.args[0].value if call.args and call.args[0].keyword is None else None
                index = list(seq.elements).index(element)
                if isinstance(fn, cst.Lambda) and index < len(fn.params.params) and depth < 3:
                    param = fn.params.params[index].name.value
                    return self.name_reads_safe(param, fn.body, depth + 1)
        return self._fail(cur, "an element of a tuple or list")

    def _derived_safe(self, assign: cst.Assign, depth: int) -> bool:
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name) or depth >= 3:
            return self._fail(assign, "an assignment")
        derived = assign.targets[0].target.value
        outside = [n for n in loads(self.scope, derived, self.parents) if not _contains(self.loop, n, self.parents)]
        if outside:
            return self._fail(assign, f"`{derived}`, read after the loop")
        return self.name_reads_safe(derived, self.loop, depth + 1)

    def _fail(self, node: cst.CSTNode, why: str) -> bool:
        if not self.reason:
            self.reason = why
        return False


def _contains(root: cst.CSTNode, node: cst.CSTNode, parents: dict[int, cst.CSTNode]) -> bool:
    cur: Optional[cst.CSTNode] = node
    while cur is not None:
        if cur is root:
            return True
        cur = parents.get(id(cur))
    return False


def read_outside(scope: cst.CSTNode, loop: cst.CSTNode, name: str) -> bool:
    """Whether ``name`` is read anywhere in ``scope`` outside ``loop``."""
    parents = parent_map(scope)
    return any(not _contains(loop, n, parents) for n in loads(scope, name, parents))


# --------------------------------------------------------------------------------------
# Static shapes (TX5xx)
# --------------------------------------------------------------------------------------
def imports_torch(ctx: FileContext) -> bool:
    return any(q == "torch" or q.startswith("torch.") for q in ctx.aliases.values())


class MaskNames:
    """Names bound to boolean tensors (``m = x > 0``, ``valid = torch.isfinite(x)``) in each
    function (or the module), recorded as the traversal meets the assignments, and names
    spelled like masks (``mask``, ``pad_mask``)."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self._by_scope: dict[cst.CSTNode, set[str]] = {}

    def record(self, assign: cst.Assign) -> None:
        """Call from ``visit_Assign``."""
        if len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name):
            if is_bool_tensor_expr(assign.value, self.ctx):
                self._by_scope.setdefault(enclosing_scope(self.ctx), set()).add(assign.targets[0].target.value)

    def leave_function(self, fn: cst.FunctionDef) -> None:
        """Call from ``leave_FunctionDef``: nothing after the function is in its scope (and a
        rule whose state is back to empty after each top-level statement can be checked one
        statement at a time: porter.incremental)."""
        self._by_scope.pop(fn, None)

    def is_mask(self, index: cst.CSTNode) -> bool:
        if isinstance(index, cst.Name):
            return "mask" in index.value.lower() or index.value in self._by_scope.get(enclosing_scope(self.ctx), ())
        return is_bool_tensor_expr(index, self.ctx)


def single_index(sub: cst.Subscript) -> Optional[cst.BaseExpression]:
    """``x[i]`` -> ``i`` (one plain index, no slice, no star)."""
    if len(sub.slice) != 1:
        return None
    el = sub.slice[0].slice
    if isinstance(el, cst.Index) and el.star is None:
        return el.value
    return None


def data_dependent(expr: cst.CSTNode) -> Optional[cst.Call]:
    """The first call in ``expr`` whose result is a tensor's data used as a size
    (``n.item()``, ``lengths.max()``, ``mask.sum()``, ``t.tolist()``)."""
    for n in walk(expr):
        if isinstance(n, cst.Call) and method_name(n) in _SIZE_FROM_DATA:
            return n
    return None


_SIZE_FROM_DATA = ("item", "tolist", "max", "min", "sum", "amax", "amin", "argmax", "argmin", "count_nonzero", "prod")
