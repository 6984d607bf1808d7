from __future__ import annotations

from typing import Optional

import libcst as cst

from porter.astutil import assigned_values, method_name, walk
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity

from ._host_sync import (
    ReadChecker, calls_to, enclosing_scope, is_host_sum, loads, parent_map, read_outside, step_loop,
)


class DeviceAccumulator(Rule):
    """
    ## What it does
    Finds running metrics summed on the host inside a training or evaluation loop
    (`total_loss += loss.item()`, `correct += pred.eq(target).sum().item()`) and keeps the sum
    on the device instead (`total_loss += loss.detach()`, `correct += pred.eq(target).sum()`).
    When the accumulator is read after the loop, one statement after the loop turns it back
    into a Python number: `total_loss = float(total_loss)` for a float sum started at a float
    literal (`total_loss = 0.0`), `correct = int(correct)` for a count started at an int
    literal (`correct = 0`): the same value and type as `.item()` gave, and the initial value
    unchanged when the loop ran zero times. Otherwise (`total = 0` summing floats, whose type
    after zero iterations is `int`):

        if isinstance(total_loss, torch.Tensor):
            total_loss = total_loss.item()

    so the code after the loop sees the same Python type as before in every case.

    Reads of the accumulator inside the loop (the language-model pattern
    `cur_loss = total_loss / log_interval; print('{:5.2f}'.format(cur_loss, math.exp(cur_loss)))`)
    are allowed when every one of them prints the same for a 0-dim tensor as for a number:
    arithmetic, then a format spec (f-string, `str.format`, numeric `%`), `math.*`, `float()`,
    `int()`, or a step closure doing the same. Such a read transfers only in the steps that
    reach it (the logging steps). Any other read (`print(acc)`, `str(acc)`, `round(acc, 2)`,
    a comparison, a call of unknown code) leaves the statement reported but unchanged.

    A per-step history kept in a list of the function's own (`history.append(loss.item())`,
    `losses.append(loss.detach().cpu().numpy())`) and not read in the step keeps the device
    tensors (`history.append(loss.detach())`); where the list is read after the loop, one
    statement after the loop converts them to what the step appended:
    `history[:] = [v.item() if isinstance(v, torch.Tensor) else v for v in history]` (the same
    list object; values appended before the loop are left as they are). Unsafe: until the loop
    ends the list holds tensors.

    A dict of running sums, one per loss (`meters[k] += v.item()` for the losses of a
    multi-task or detection model; `meters` a `defaultdict(float)` or `{}` of the function's
    own), sums on the device when the loop reads the dict only to format its values
    (`' '.join(f'{k}={v / n:.4f}' for k, v in meters.items())`) or to clear it; read after
    the loop, it is converted there: `meters.update({k: v.item() if isinstance(v,
    torch.Tensor) else v for k, v in meters.items()})`. Unsafe (float32 sums).

    ## Why
    On XLA `.item()` executes the pending graph and copies the value to the host: inside the
    step that is an extra graph execution (and often an extra compilation) and a device-to-host
    transfer every step. Summing on the device costs nothing; the value is read once.

    ## Fix safety
    Safe for counts (`.sum().item()` of a comparison): integer sums are exact, and the
    accumulator is not read in the loop. Unsafe otherwise: a float sum accumulates in float32
    on the device instead of Python's float64, so printed metrics can differ in their last
    digits (and in-loop reads are computed in float32).
    """

    code = "TX401"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "device-accumulator"
    target = "torch-xla"
    summary = "acc += x.item() in the step -> accumulate on the device, read once after the loop"
    severity = Severity.WARNING
    needs_text = (".item(", ".append(")
    examples = [
        Example(
            """
            import torch

            def test(model, loader):
                correct = 0
                with torch.no_grad():
                    for data, target in loader:
                        output = model(data)
                        pred = output.argmax(dim=1, keepdim=True)
                        correct += pred.eq(target.view_as(pred)).sum().item()
                print(correct / len(loader.dataset))
            """,
            """
            import torch

            def test(model, loader):
                correct = 0
                with torch.no_grad():
                    for data, target in loader:
                        output = model(data)
                        pred = output.argmax(dim=1, keepdim=True)
                        correct += pred.eq(target.view_as(pred)).sum()
                    correct = int(correct)
                print(correct / len(loader.dataset))
            """,
            title="a count: exact, safe",
        ),
        Example(
            """
            import torch

            def train(model, loader, optimizer, criterion):
                running_loss = 0.0
                for inputs, labels in loader:
                    optimizer.zero_grad()
                    loss = criterion(model(inputs), labels)
                    loss.backward()
                    optimizer.step()
                    running_loss += loss.item() * inputs.size(0)
                return running_loss / len(loader.dataset)
            """,
            """
            import torch

            def train(model, loader, optimizer, criterion):
                running_loss = 0.0
                for inputs, labels in loader:
                    optimizer.zero_grad()
                    loss = criterion(model(inputs), labels)
                    loss.backward()
                    optimizer.step()
                    running_loss += loss.detach() * inputs.size(0)
                running_loss = float(running_loss)
                return running_loss / len(loader.dataset)
            """,
            unsafe=True,
            title="a float sum: float32 on the device, unsafe",
        ),
        Example(
            """
            import math
            import torch

            def train(model, data, criterion, epoch, log_interval):
                total_loss = 0.
                for batch, (x, y) in enumerate(data):
                    model.zero_grad()
                    loss = criterion(model(x), y)
                    loss.backward()
                    total_loss += loss.item()
                    if batch % log_interval == 0 and batch > 0:
                        cur_loss = total_loss / log_interval
                        print('| epoch {:3d} | loss {:5.2f} | ppl {:8.2f}'.format(epoch, cur_loss, math.exp(cur_loss)))
                        total_loss = 0
            """,
            """
            import math
            import torch

            def train(model, data, criterion, epoch, log_interval):
                total_loss = 0.
                for batch, (x, y) in enumerate(data):
                    model.zero_grad()
                    loss = criterion(model(x), y)
                    loss.backward()
                    total_loss += loss.detach()
                    if batch % log_interval == 0 and batch > 0:
                        cur_loss = total_loss / log_interval
                        print('| epoch {:3d} | loss {:5.2f} | ppl {:8.2f}'.format(epoch, cur_loss, math.exp(cur_loss)))
                        total_loss = 0
            """,
            unsafe=True,
            title="read only in logging steps, through a format spec; not read after the loop",
        ),
        Example(
            """
            import torch

            def train(model, loader, optimizer):
                total = 0
                for x, y in loader:
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    total += loss.item()
                    print(total)
            """,
            None,
            title="printed with print(total): a tensor would print as tensor(...), so reported only",
        ),
        Example(
            """
            import torch

            def train(model, loader, optimizer):
                total = 0
                for x, y in loader:
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    total += loss.item()
                return total
            """,
            """
            import torch

            def train(model, loader, optimizer):
                total = 0
                for x, y in loader:
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    total += loss.detach()
                if isinstance(total, torch.Tensor):
                    total = total.item()
                return total
            """,
            unsafe=True,
            title="a float sum started at the int 0: after zero iterations it is still an int, so the type is tested",
        ),
        Example(
            """
            import torch

            def train(model, loader, optimizer):
                history = []
                for x, y in loader:
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    history.append(loss.item())
                return sum(history) / len(history)
            """,
            """
            import torch

            def train(model, loader, optimizer):
                history = []
                for x, y in loader:
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    history.append(loss.detach())
                history[:] = [v.item() if isinstance(v, torch.Tensor) else v for v in history]
                return sum(history) / len(history)
            """,
            unsafe=True,
            title="a history of the loss: tensors in the step, numbers after the loop",
        ),
    ]
    valid = [
        # outside a training loop
        "import torch\ntotal = 0\nfor x in xs:\n    total += x.item()\n",
        # already on the device
        "import torch\nfor x, y in loader:\n    loss = f(x, y)\n    loss.backward()\n    total += loss.detach()\n",
        # not a running sum
        "import torch\nfor x, y in loader:\n    loss = f(x, y)\n    loss.backward()\n    step += 1\n",
    ]

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if _is_meter_sum(node):
            self._meter_sum(node)
            return
        if not is_host_sum(node):
            return
        loop = step_loop(self.ctx)
        if loop is None:
            return
        name = node.target.value  # type: ignore[attr-defined]
        scope = enclosing_scope(self.ctx)
        checker = ReadChecker(self.ctx, loop, scope)
        msg = (
            f"`{name} += ....item()` in the step copies a value to the host every step; "
            f"accumulate on the device and read `{name}` once after the loop"
        )
        if not checker.name_reads_safe(name, loop):
            self.report(node, f"{msg} (not fixed: `{name}` is used in the loop as {checker.reason})")
            return
        items = [c for c in calls_to(node.value, ("item",)) if not c.args]
        edits = [self.replace(c, _without_item(c)) for c in items]
        imports: tuple[str, ...] = ()
        if read_outside(scope, loop, name):
            edits.append(self.replace(loop, self._convert_after(loop, scope)))
            if not _number_kind(scope, loop, name):
                imports = ("torch",)  # the isinstance test names torch.Tensor
        exact = all(_is_count(c) for c in items) and not _loads_in(loop, name)
        if not exact:
            msg += " (unsafe fix: a float sum runs in float32 on the device)"
        self.report(node, msg, Fix(tuple(edits), Safety.SAFE if exact else Safety.UNSAFE, imports=imports))

    def _meter_sum(self, node: cst.AugAssign) -> None:
        """``meters[k] += v.item()``: a dict of running sums (one per loss of a multi-task or
        detection model) summed on the device, where the loop reads the dict only to format its
        values (``f"{k}={v / n:.4f}" for k, v in meters.items()``) or to clear it."""
        loop = step_loop(self.ctx)
        if loop is None:
            return
        name = node.target.value.value  # type: ignore[attr-defined]
        scope = enclosing_scope(self.ctx)
        values = assigned_values(scope, name)
        if not values or not all(_empty_dict(v, self.ctx) for v in values) or not _meter_reads_safe(loop, name):
            return  # TX403 reports the copy
        items = [c for c in calls_to(node.value, ("item",)) if not c.args]
        edits = [self.replace(c, _without_item(c)) for c in items]
        imports: tuple[str, ...] = ()
        if read_outside(scope, loop, name):
            torch = self.ctx.module_alias("torch")
            back = f"{name}.update({{k: v.item() if isinstance(v, {torch}.Tensor) else v for k, v in {name}.items()}})"
            edits.append(self._after_loop(loop, back, lambda updated: _meters_on_device(updated, name)))
            imports = ("torch",)
        self.report(node, f"`{name}[...] += ....item()` in the step copies a value to the host every step; sum on the "
                          f"device (the loop only formats or clears `{name}`) (unsafe fix: float sums run in float32 on "
                          "the device)", Fix(tuple(edits), Safety.UNSAFE, imports=imports))

    def visit_Call(self, node: cst.Call) -> None:
        """``history.append(loss.item())`` (or ``.cpu().numpy()``) in the step: the list keeps
        the device tensors (``loss.detach()``) and, where it is read after the loop, one
        statement after the loop turns them into what the step appended."""
        if method_name(node) != "append" or len(node.args) != 1 or not isinstance(node.func.value, cst.Name):  # type: ignore[attr-defined]
            return
        if not isinstance(self.ctx.parent, cst.Expr):
            return
        split = _host_copy(node.args[0].value)
        loop = step_loop(self.ctx)
        if split is None or loop is None:
            return
        tensor, suffix = split
        name = node.func.value.value  # type: ignore[attr-defined]
        scope = enclosing_scope(self.ctx)
        values = assigned_values(scope, name)
        if not values or not all(isinstance(v, cst.List) for v in values) or not _only_appended(loop, name):
            return  # not a list of the scope's own, or read in the step: TX403 reports the copy
        edits = [self.replace(node.args[0].value, cst.Call(cst.Attribute(tensor, cst.Name("detach"))))]
        imports: tuple[str, ...] = ()
        if read_outside(scope, loop, name):
            torch = self.ctx.module_alias("torch")
            back = f"{name}[:] = [v{suffix} if isinstance(v, {torch}.Tensor) else v for v in {name}]"
            edits.append(self._after_loop(loop, back, lambda updated: _appends_on_device(updated, name)))
            imports = ("torch",)
        self.report(node, f"`{name}.append(...{suffix})` in the step copies a value to the host every step; keep the "
                          f"device tensors in `{name}` and convert them once after the loop (unsafe fix: `{name}` "
                          "holds tensors until the loop ends)",
                    Fix(tuple(edits), Safety.UNSAFE, imports=imports))

    def _after_loop(self, loop: cst.CSTNode, statement: str, on_device) -> Edit:
        """The edit that puts ``statement`` after ``loop``, decided on the updated loop: only
        once ``on_device(updated)`` says its values stay tensors (the engine applies one edit
        per node and pass, so this loop's other fixes may land first)."""
        back = cst.parse_statement(statement + "\n")
        return self.replace(loop, lambda updated: cst.FlattenSentinel([updated, back]) if on_device(updated) else updated)

    def _convert_after(self, loop: cst.CSTNode, scope: cst.CSTNode):
        """The edit after ``loop``: for every running sum of the loop that ends up on the
        device once the selected fixes are applied, convert it back to a number. Decided on
        the updated loop, so it is right whichever of the loop's fixes were chosen (the
        engine applies one such edit per node and pass)."""
        # per loop (in the traversal's memo): names whose sums this rule moves to the device
        # and that are read after it
        key = ("tx401_converted", loop)
        names = self.ctx.cache.get(key)
        if names is None:
            names = []
            for n in walk(loop):
                if isinstance(n, cst.AugAssign) and is_host_sum(n) and n.target.value not in names:  # type: ignore[attr-defined]
                    name = n.target.value  # type: ignore[attr-defined]
                    if read_outside(scope, loop, name) and ReadChecker(self.ctx, loop, scope).name_reads_safe(name, loop):
                        names.append(name)
            self.ctx.cache[key] = names
        torch = self.ctx.module_alias("torch")

        kinds = {n: _number_kind(scope, loop, n) for n in names}

        def apply(updated: cst.CSTNode):
            on_device = [n for n in names if _sums_on_device(updated, n)]
            if not on_device:
                return updated
            return cst.FlattenSentinel([updated, *(_back_to_number(n, kinds[n], torch) for n in on_device)])

        return apply


# host copies of a tensor appended to a list: the conversion the list's reads expect
_COPIES = {("item",): ".item()", ("cpu", "item"): ".item()", ("detach", "item"): ".item()",
           ("cpu", "numpy"): ".cpu().numpy()", ("detach", "cpu", "numpy"): ".cpu().numpy()",
           ("cpu", "detach", "numpy"): ".cpu().numpy()"}


def _host_copy(value: cst.BaseExpression) -> Optional[tuple[cst.BaseExpression, str]]:
    """``loss.item()`` -> (``loss``, ".item()"), ``loss.detach().cpu().numpy()`` -> (``loss``,
    ".cpu().numpy()"); None for anything else."""
    methods: list[str] = []
    while isinstance(value, cst.Call) and not value.args and isinstance(value.func, cst.Attribute):
        methods.insert(0, value.func.attr.value)
        value = value.func.value
    if isinstance(value, cst.Attribute) and value.attr.value == "data":
        value = value.value
    suffix = _COPIES.get(tuple(methods))
    return (value, suffix) if suffix is not None and isinstance(value, (cst.Name, cst.Attribute)) else None


def _is_meter_sum(node: cst.CSTNode, name: Optional[str] = None, any_value: bool = False) -> bool:
    """``meters[k] += <expr with .item()>`` (``any_value``: whatever is added), on a plain name
    (``name`` when given)."""
    if not (isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.AddAssign)
            and isinstance(node.target, cst.Subscript) and isinstance(node.target.value, cst.Name)):
        return False
    if name is not None and node.target.value.value != name:
        return False
    return any_value or any(not c.args for c in calls_to(node.value, ("item",)))


def _meters_on_device(loop: cst.CSTNode, name: str) -> bool:
    """The loop sums into entries of ``name`` and no sum copies to the host any more."""
    sums = [n for n in walk(loop) if _is_meter_sum(n, name, any_value=True)]
    return bool(sums) and not any(calls_to(n.value, ("item",)) for n in sums)  # type: ignore[attr-defined]


def _empty_dict(value: Optional[cst.BaseExpression], ctx) -> bool:
    """``{}``, ``dict()``, ``defaultdict(float)`` / ``defaultdict(int)``."""
    if isinstance(value, cst.Dict):
        return not value.elements
    if not isinstance(value, cst.Call):
        return False
    qual = ctx.qualname(value.func) or ""
    if qual == "builtins.dict" or (isinstance(value.func, cst.Name) and value.func.value == "dict"):
        return not value.args
    return qual == "collections.defaultdict" and len(value.args) == 1 and \
        isinstance(value.args[0].value, cst.Name) and value.args[0].value.value in ("float", "int")


_FORMATTED = (cst.FormattedStringExpression,)


def _meter_reads_safe(loop: cst.CSTNode, name: str) -> bool:
    """Every read of the dict ``name`` in ``loop`` is a sum into one of its entries, a
    ``name.clear()`` statement, or ``name.items()`` / ``name.values()`` iterated by a
    comprehension whose value variable is read only in f-string fields with a format spec
    (arithmetic around it allowed): a 0-dim tensor formats as its number does."""
    parents = parent_map(loop)
    for n in loads(loop, name, parents):
        parent = parents.get(id(n))
        if isinstance(parent, cst.Subscript) and isinstance(parents.get(id(parent)), cst.AugAssign) \
                and parents[id(parent)].target is parent:
            continue
        call = parents.get(id(parent)) if isinstance(parent, cst.Attribute) and parent.value is n else None
        if not isinstance(call, cst.Call) or call.func is not parent or call.args:
            return False
        method = parent.attr.value  # type: ignore[union-attr]
        if method == "clear" and isinstance(parents.get(id(call)), cst.Expr):
            continue
        comp_for = parents.get(id(call))
        if method in ("items", "values") and isinstance(comp_for, cst.CompFor) and comp_for.iter is call \
                and _formatted_only(comp_for, method, parents):
            continue
        return False
    return True


def _formatted_only(comp_for: cst.CompFor, method: str, parents: dict) -> bool:
    target = comp_for.target
    if method == "items":
        if not (isinstance(target, cst.Tuple) and len(target.elements) == 2 and isinstance(target.elements[1].value, cst.Name)):
            return False
        value = target.elements[1].value.value  # type: ignore[attr-defined]
    elif isinstance(target, cst.Name):
        value = target.value
    else:
        return False
    comp = parents.get(id(comp_for))
    if not isinstance(comp, (cst.GeneratorExp, cst.ListComp)):
        return False
    for read in loads(comp.elt, value, parents):
        node: cst.CSTNode = read
        while isinstance(parents.get(id(node)), cst.BinaryOperation):
            node = parents[id(node)]
        field = parents.get(id(node))
        if not (isinstance(field, _FORMATTED) and field.expression is node and field.format_spec):
            return False
    return True


def _appends_on_device(loop: cst.CSTNode, name: str) -> bool:
    """The loop appends to ``name`` and no append copies to the host any more."""
    appends = [n for n in walk(loop) if isinstance(n, cst.Call) and method_name(n) == "append" and len(n.args) == 1
               and isinstance(n.func.value, cst.Name) and n.func.value.value == name]  # type: ignore[attr-defined]
    return bool(appends) and not any(_host_copy(n.args[0].value) for n in appends)


def _only_appended(loop: cst.CSTNode, name: str) -> bool:
    """Every read of ``name`` in ``loop`` is the receiver of an ``.append(...)`` statement."""
    parents = parent_map(loop)
    for n in loads(loop, name, parents):
        attr = parents.get(id(n))
        call = parents.get(id(attr)) if attr is not None else None
        if not (isinstance(attr, cst.Attribute) and attr.value is n and attr.attr.value == "append"
                and isinstance(call, cst.Call) and call.func is attr and isinstance(parents.get(id(call)), cst.Expr)):
            return False
    return True


def _back_to_number(name: str, kind: str, torch: str) -> cst.BaseStatement:
    """``total = float(total)`` where that gives what ``.item()`` gave and the loop's initial
    value when it ran zero times (a float sum started at a float literal, a count started at
    an int literal); the isinstance test otherwise."""
    if kind in ("int", "float"):
        return cst.parse_statement(f"{name} = {kind}({name})\n")
    return cst.parse_statement(f"if isinstance({name}, {torch}.Tensor):\n    {name} = {name}.item()\n")


def _number_kind(scope: cst.CSTNode, loop: cst.CSTNode, name: str) -> str:
    """"int" when every sum of ``name`` in the loop is a count and every plain assignment of
    it in the scope an int literal, "float" when no sum is a count and every assignment a
    float literal, "" otherwise."""
    sums = [n for n in walk(loop) if isinstance(n, cst.AugAssign) and isinstance(n.target, cst.Name)
            and n.target.value == name]
    counts = [all(_is_count(c) for c in calls_to(n.value, ("item",)) if not c.args) and
              bool([c for c in calls_to(n.value, ("item",)) if not c.args]) for n in sums]
    inits = assigned_values(scope, name)
    if not sums or not inits:
        return ""
    if all(counts) and all(isinstance(v, cst.Integer) for v in inits):
        return "int"
    if not any(counts) and all(isinstance(v, cst.Float) for v in inits):
        return "float"
    return ""


def _sums_on_device(loop: cst.CSTNode, name: str) -> bool:
    sums = [
        n for n in walk(loop)
        if isinstance(n, cst.AugAssign) and isinstance(n.target, cst.Name) and n.target.value == name
    ]
    return bool(sums) and not any(calls_to(n.value, ("item",)) for n in sums)


def _loads_in(loop: cst.CSTNode, name: str) -> list[cst.Name]:
    parents = parent_map(loop)
    return [n for n in loads(loop, name, parents) if not isinstance(parents.get(id(n)), cst.AugAssign)]


def _is_count(item: cst.Call) -> bool:
    """``<bool tensor>.sum().item()``: an exact integer count."""
    recv = item.func.value  # type: ignore[attr-defined]
    if not (isinstance(recv, cst.Call) and method_name(recv) == "sum" and not recv.args):
        return False
    inner = recv.func.value  # type: ignore[attr-defined]
    return _is_bool(inner)


def _is_bool(expr: cst.CSTNode) -> bool:
    if isinstance(expr, cst.Comparison):
        return True
    if isinstance(expr, cst.Call) and method_name(expr) in ("eq", "ne", "gt", "lt", "ge", "le", "isnan", "isinf", "isfinite", "bool"):
        return True
    return False


def _without_item(call: cst.Call) -> cst.BaseExpression:
    """``x.item()`` -> ``x`` for a count (no gradient), else ``x.detach()`` (keeps the
    accumulator from holding every step's autograd graph)."""
    recv = call.func.value  # type: ignore[attr-defined]
    if _is_count(call):
        return recv.with_changes(lpar=call.lpar, rpar=call.rpar) if call.lpar else recv
    return call.with_changes(func=call.func.with_changes(attr=cst.Name("detach")))  # type: ignore[attr-defined]
