from typing import Iterator, Optional

import libcst as cst
from libcst.helpers import parse_template_expression

from porter import astutil
from porter.context import dotted_name
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity, module_fact

from . import _training as tr


class LoopOffsetSlice(Rule):
    """
    ## What it does
    Reports a training or evaluation loop over `range(...)` that slices or indexes a tensor
    living on the device at the loop's offset: `data[i:i + bptt]` in the loop body, or a
    helper of the file called with the loop variable that does it (a language model's
    `get_batch(train_data, i)` returning `source[i:i + seq_len]`). A tensor counts as living
    on the device when the file binds it from a `.to(device)`/`.cuda()` move, from a helper
    of the file returning one (`batchify(...)`), or from a factory given `device=`.
    Slices that are moved right away (`X[i:i + bs].to(device)`) are the recommended form and
    are not reported.

    ## Why
    XLA traces Python integers as constants: each offset `i` gives a different graph, so
    the loop compiles a new graph at every step of the first epoch (measured here: 12
    compilations for 12 offsets, against 1 when the slice is taken on the CPU and moved).
    Later epochs reuse the cached graphs, but the compile time and the memory of one
    executable per offset remain.

    The fix (for the helper form) keeps the source tensor on the CPU and moves each slice:
    when every tensor the file passes to the helper for the sliced parameter comes, through
    plain names and function parameters, from calls of one function of the file whose single
    `return` is a device move (`return data.to(device)` in `batchify`), that move is dropped
    and each offset slice in the helper is moved instead
    (`data = source[i:i + seq_len].to(torch_xla.device())`): one host-to-device copy per
    step, like a DataLoader's, and one graph for every full window. The helper must use the
    parameter only in those slices and in length reads (`len(source)`, `source.size(0)`).
    Otherwise it is reported: keep the source on the CPU and move each slice by hand, or
    gather on the device with an index built on the CPU and moved
    (`source.index_select(0, torch.arange(i, i + n).to(device))`).

    A window cut with `min(bptt, len(source) - 1 - i)` is shorter at the end of the stream:
    the message says so; that last window still compiles one more graph (and one more for
    its backward pass), once.

    Where the slices are one-dimensional (`source[i:i + n]`) and nothing in the helper or
    the loop writes into a tensor in place, the fix is instead to gather:
    `source.index_select(0, torch.arange(source.size(0))[i:i + n].to(source.device))`: the
    same rows (the index is cut from an arange of the same length with the same slice, so
    Python's bounds and clamping apply), taken by a data index, so one graph serves every
    offset; the tensor stays on its device and every other user of it is unaffected.

    ## Fix safety
    The gather is safe: the same values, a copy instead of a view, which only matters to code
    that writes into one of them (then no gather is offered). The host fix is unsafe: the slices go to `torch_xla.device()`, while the data used to go to the device
    `batchify` was given (the same in a port that runs on XLA, not when the program chose
    the CPU, e.g. `--no-cuda`). Every other user of `batchify`'s result now gets a CPU
    tensor: its shape reads are unchanged, but code that computes with it on the device
    (outside the helper) would mix devices. The values, and so the numerics, are unchanged.
    """

    code = "TX306"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-loop-offset-slice"
    target = "torch-xla"
    summary = "device tensor sliced at a loop-varying offset: one compiled graph per offset; keep it on the host, move the slices"
    severity = Severity.WARNING
    needs_text = ("range(",)
    examples = [
        Example(
            """
            import torch

            def batchify(data, bsz):
                nbatch = data.size(0) // bsz
                data = data[:nbatch * bsz]
                return data.view(bsz, -1).t().contiguous().to(device)

            def get_batch(source, i):
                seq_len = min(bptt, len(source) - 1 - i)
                data = source[i:i + seq_len]
                target = source[i + 1:i + 1 + seq_len].view(-1)
                return data, target

            train_data = batchify(corpus.train, 20)

            def train(model, optimizer):
                for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
                    data, targets = get_batch(train_data, i)
                    loss = criterion(model(data), targets)
                    loss.backward()
                    optimizer.step()
            """,
            """
            import torch

            def batchify(data, bsz):
                nbatch = data.size(0) // bsz
                data = data[:nbatch * bsz]
                return data.view(bsz, -1).t().contiguous().to(device)

            def get_batch(source, i):
                seq_len = min(bptt, len(source) - 1 - i)
                data = source.index_select(0, torch.arange(source.size(0))[i:i + seq_len].to(source.device))
                target = source.index_select(0, torch.arange(source.size(0))[i + 1:i + 1 + seq_len].to(source.device)).view(-1)
                return data, target

            train_data = batchify(corpus.train, 20)

            def train(model, optimizer):
                for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
                    data, targets = get_batch(train_data, i)
                    loss = criterion(model(data), targets)
                    loss.backward()
                    optimizer.step()
            """,
            title="a language model's bptt loop: get_batch gathers its windows with a CPU-built index",
        ),
        Example(
            """
            import torch

            X = torch.randn(96, 20, device=device)

            def fit(model):
                for i in range(0, 96, 8):
                    model(X[i:i + 8]).sum().backward()
            """,
            """
            import torch

            X = torch.randn(96, 20, device=device)

            def fit(model):
                for i in range(0, 96, 8):
                    model(X.index_select(0, torch.arange(X.size(0))[i:i + 8].to(X.device))).sum().backward()
            """,
            title="inline slicing of a device tensor",
        ),
        Example(
            """
            import torch

            def batchify(data, bsz):
                nbatch = data.size(0) // bsz
                return data[:nbatch * bsz].view(bsz, -1).t().contiguous().to(device)

            def get_step(source, i):
                return source[i], source[i + 1]

            train_data = batchify(corpus.train, 20)

            def train(model, optimizer):
                for i in range(0, train_data.size(0) - 1):
                    token, target = get_step(train_data, i)
                    model(token, target).backward()
                    optimizer.step()
            """,
            """
            import torch
            import torch_xla

            def batchify(data, bsz):
                nbatch = data.size(0) // bsz
                return data[:nbatch * bsz].view(bsz, -1).t().contiguous()

            def get_step(source, i):
                return source[i].to(torch_xla.device()), source[i + 1].to(torch_xla.device())

            train_data = batchify(corpus.train, 20)

            def train(model, optimizer):
                for i in range(0, train_data.size(0) - 1):
                    token, target = get_step(train_data, i)
                    model(token, target).backward()
                    optimizer.step()
            """,
            unsafe=True,
            title="indexed, not sliced: batchify keeps the data on the host, the helper moves each row",
        ),
        Example(
            """
            import torch

            def get_batch(source, i):
                return source[i:i + 8], source[i + 1:i + 9]

            train_data = corpus.train.view(20, -1).t().contiguous().to(device)

            def train(model, optimizer):
                for i in range(0, train_data.size(0) - 1, 8):
                    data, targets = get_batch(train_data, i)
                    data.clamp_(0, 100)
                    model(data, targets).backward()
                    optimizer.step()
            """,
            None,
            title="the loop writes into a batch (a view of the data), and no helper moves the data: reported",
        ),
    ]
    valid = [
        # slices moved right away: one graph
        """
        import torch
        X = torch.randn(96, 20)
        def fit(model, device):
            for i in range(0, 96, 8):
                model(X[i:i + 8].to(device)).sum().backward()
        """,
        # a CPU tensor sliced and then moved in a helper
        """
        import torch
        data = torch.randn(96, 20)
        def get_batch(source, i):
            return source[i:i + 8].to(device)
        def fit(model):
            for i in range(0, 96, 8):
                model(get_batch(data, i)).sum().backward()
        """,
        # not a training or evaluation loop
        """
        import torch
        X = torch.randn(96, 20, device=device)
        for i in range(0, 96, 8):
            print(X[i:i + 8])
        """,
    ]

    def visit_For(self, node: cst.For) -> None:
        var = _range_var(node, self.ctx)
        if var is None or tr.loop_kind(node, self.ctx) not in ("train", "eval"):
            return
        functions = _functions(self.ctx)
        for n in tr._own_nodes(node):
            if isinstance(n, cst.Subscript) and _offset_index(n, var) and not self._moved(n, node):
                name = dotted_name(n.value)
                if name and self._on_device(n.value, functions):
                    message = f"`{name}` lives on the device and is indexed at the loop offset `{var}`: XLA compiles one graph per offset; "
                    if _gatherable(n) and not _mutated_in(node, self.ctx):
                        self.report(n, message + "gathered with index_select and an index built on the CPU "
                                    "(one graph for every window of the same length)",
                                    Fix((Edit(n, self._gather(n)),), imports=("torch",)))
                        continue
                    self.report(
                        n,
                        message + "keep it on the CPU and move each slice "
                        f"(`{name}[...].to(device)`), or gather with index_select and an index built "
                        "on the CPU",
                    )
            elif isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in functions:
                fn = functions[n.func.value]
                for tensor_arg in _sliced_by_offset(fn, n, var):
                    name = dotted_name(tensor_arg)
                    if name and self._on_device(tensor_arg, functions):
                        message = (
                            f"`{n.func.value}(...)` slices `{name}`, which lives on the "
                            f"device, at the loop offset `{var}`: XLA compiles one graph per offset; "
                        )
                        gather = self._gather_fix(fn, n, var, node)
                        if gather is not None:
                            self.report(n, message + f"`{n.func.value}` gathers its windows with index_select "
                                        "and an index built on the CPU (one graph for every window of the same "
                                        "length; the tensor stays where it is)", gather)
                            continue
                        fix = self._host_fix(fn, n, var, functions)
                        if fix is None:
                            self.report(
                                n,
                                message + f"keep `{name}` on the CPU and move each slice in `{n.func.value}` "
                                "(`.to(device)`), or gather with index_select and an index built on the CPU",
                            )
                            continue
                        fix, placer, ragged = fix
                        self.report(
                            n,
                            message + f"the fix keeps the output of `{placer}` on the CPU and moves each "
                            f"slice to the device in `{n.func.value}` (one host-to-device copy per step)"
                            + (f"; the last window of `{n.func.value}` is shorter (min(...)): XLA still "
                               "compiles one more graph for it" if ragged else ""),
                            fix,
                        )

    def _gather(self, sub: cst.Subscript):
        """``x[a:b]`` -> ``x.index_select(0, torch.arange(x.size(0))[a:b].to(x.device))``: the
        same rows (the index is cut from an arange of the same length with the same slice, so
        bounds, clamping and steps are Python's), gathered by a data index instead of constant
        offsets."""
        torch = self.ctx.module_alias("torch")

        def apply(updated: cst.CSTNode) -> cst.CSTNode:
            if not isinstance(updated, cst.Subscript):
                return updated  # gathered already (the helper serves several loops)
            src = updated.value  # the sliced tensor, as nodes (written three times)
            index = parse_template_expression(f"{torch}.arange({{x}}.size(0))[_]", x=src.deep_clone())
            assert isinstance(index, cst.Subscript)
            index = index.with_changes(slice=updated.slice)
            call = parse_template_expression("{x}.index_select(0, _.to({y}.device))", x=src, y=src.deep_clone())
            moved = call.args[1].value  # type: ignore[attr-defined]
            moved = moved.with_changes(func=moved.func.with_changes(value=index))
            return call.with_changes(args=[call.args[0], call.args[1].with_changes(value=moved)])  # type: ignore[attr-defined]

        return apply

    def _gather_fix(self, helper: cst.FunctionDef, call: cst.Call, var: str, loop: cst.For) -> Optional[Fix]:
        """Every offset slice of the helper's tensor parameters gathered (see _gather): when
        each is a one-dimensional slice (``source[i:i + n]``) that the helper never writes
        into, and the loop writes into nothing the helper returns."""
        offset_params = {p for p, v in _bound(helper, call).items() if isinstance(v, cst.Name) and v.value == var}
        slices = _offset_slices(helper, offset_params)
        if not slices or not all(_gatherable(sub) for sub in slices):
            return None
        if _writes(helper.body, self.ctx) or _mutated_in(loop, self.ctx):
            return None
        return Fix(tuple(Edit(sub, self._gather(sub)) for sub in slices), imports=("torch",))

    def _host_fix(self, helper: cst.FunctionDef, call: cst.Call, var: str, functions: dict):
        """Keep the batched data on the host and move the slices: possible when every tensor
        that any call of ``helper`` passes for the sliced parameter comes (through plain names
        and function parameters) from calls of one module function whose single ``return``
        is a device move (``return data.to(device)``). Returns (fix, that function's name,
        whether the helper's windows are ragged) or None."""
        offset_params = {p for p, v in _bound(helper, call).items() if isinstance(v, cst.Name) and v.value == var}
        sliced = {sub.value.value for sub in _offset_slices(helper, offset_params)}  # type: ignore[union-attr]
        if len(sliced) != 1:
            return None
        source = next(iter(sliced))
        # every other use of the parameter in the helper is a length/shape read
        for n in astutil.walk(helper.body):
            if isinstance(n, cst.Name) and n.value == source and not _length_read(helper, n):
                if not any(sub.value is n for sub in _offset_slices(helper, offset_params)):
                    return None
        idx = tr.index(self.ctx)
        placers: set[str] = set()
        calls = idx.calls_by_name.get(helper.name.value, ())
        if not calls:
            return None
        for c in calls:
            arg = _bound(helper, c).get(source)
            if not isinstance(arg, cst.Name) or not _from_placer(arg, c, idx, functions, placers, 0):
                return None
        if len(placers) != 1:
            return None
        placer = functions[next(iter(placers))]
        returns = [r for r in astutil.walk(placer.body) if isinstance(r, cst.Return)]
        if len(returns) != 1 or returns[0].value is None:
            return None
        move = tr.as_device_move(returns[0].value, self.ctx)
        if move is None or not isinstance(returns[0].value.func, cst.Attribute):  # type: ignore[union-attr]
            return None
        edits = [Edit(returns[0].value, returns[0].value.func.value)]  # type: ignore[union-attr]
        alias = self.ctx.module_alias("torch_xla")
        for sub in _offset_slices(helper, offset_params):
            moved = cst.parse_expression(f"_.to({alias}.device())").with_changes(
                func=cst.Attribute(sub, cst.Name("to")))
            edits.append(Edit(sub, moved))
        ragged = any(isinstance(n, cst.Call) and self.ctx.qualname(n.func) == "builtins.min" for n in astutil.walk(helper.body))
        return Fix(tuple(edits), Safety.UNSAFE, imports=("torch_xla",)), placer.name.value, ragged

    def _moved(self, sub: cst.Subscript, loop: cst.For) -> bool:
        for n in tr._own_nodes(loop):
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.value is sub:
                return tr.as_device_move(n, self.ctx) is not None
        return False

    def _on_device(self, expr: cst.CSTNode, functions: dict) -> bool:
        """Bound (anywhere in the file, or by the callers of the function it is a parameter
        of) to a value that lives on the device."""
        idx = tr.index(self.ctx)
        keys = {dotted_name(expr) or ""}
        fn = tr.param_scope(expr, self.ctx)
        if isinstance(fn, cst.FunctionDef):
            positional = [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]
            for call in idx.calls_by_name.get(fn.name.value, ()):
                for i, a in enumerate(call.args):
                    if a.star:
                        break
                    if (a.keyword is not None and a.keyword.value == expr.value) or (  # type: ignore[attr-defined]
                        a.keyword is None and i < len(positional) and positional[i] == expr.value  # type: ignore[attr-defined]
                    ):
                        keys.add(dotted_name(a.value) or "")
        values = [v for k in keys for v in idx.values.get(k, ()) if v is not None]
        return any(_device_value(v, self.ctx, functions) for v in values)


def _range_var(loop: cst.For, ctx) -> Optional[str]:
    it, target = loop.iter, loop.target
    if isinstance(it, cst.Call) and ctx.qualname(it.func) == "builtins.enumerate" and it.args:
        it = it.args[0].value
        if isinstance(target, cst.Tuple) and len(target.elements) == 2:
            target = target.elements[1].value
        else:
            return None
    if isinstance(it, cst.Call) and ctx.qualname(it.func) == "builtins.range" and isinstance(target, cst.Name):
        return target.value
    return None


def _mentions(node: cst.CSTNode, name: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == name for n in astutil.walk(node))


def _offset_index(sub: cst.Subscript, var: str) -> bool:
    for el in sub.slice:
        s = el.slice
        if isinstance(s, cst.Slice):
            if any(p is not None and _mentions(p, var) for p in (s.lower, s.upper)):
                return True
        elif isinstance(s, cst.Index) and _mentions(s.value, var):
            return True
    return False


def _functions(ctx) -> dict:
    """The module's top-level functions by name (a module fact, read by lookups only)."""
    return module_fact(ctx, _top_functions)


def _top_functions(ctx) -> dict:
    out = {}
    for stmt in ctx.module.body:
        if isinstance(stmt, cst.FunctionDef):
            out[stmt.name.value] = stmt
    return out


def _params(fn: cst.FunctionDef) -> list:
    return [p.name.value for p in (*fn.params.posonly_params, *fn.params.params)]


def _sliced_by_offset(fn: cst.FunctionDef, call: cst.Call, var: str) -> Iterator[cst.BaseExpression]:
    """Arguments of ``call`` that ``fn`` slices at the parameter receiving the loop variable."""
    params = _params(fn)
    bound = {}
    for i, a in enumerate(call.args):
        if a.star:
            return
        if a.keyword is not None:
            bound[a.keyword.value] = a.value
        elif i < len(params):
            bound[params[i]] = a.value
    offset_params = [p for p, v in bound.items() if isinstance(v, cst.Name) and v.value == var]
    if not offset_params:
        return
    seen = set()
    for n in astutil.walk(fn.body):
        if isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name) and n.value.value in bound:
            if n.value.value in seen or n.value.value in offset_params:
                continue
            if any(_offset_index(n, p) for p in offset_params) and not _moved_in(fn, n):
                seen.add(n.value.value)
                yield bound[n.value.value]


def _moved_in(fn: cst.FunctionDef, sub: cst.Subscript) -> bool:
    for n in astutil.walk(fn.body):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.value is sub:
            return n.func.attr.value in ("to", "cuda")
    return False


def _device_value(value: cst.CSTNode, ctx, functions: dict, depth: int = 0) -> bool:
    for n in astutil.walk(value):
        if not isinstance(n, cst.Call):
            continue
        if tr.as_device_move(n, ctx) is not None:
            return True
        dev = astutil.arg(n, "device")
        if dev is not None and tr._to_arg_kind(dev.value, ctx) in ("xla", "device"):
            return True
        if depth == 0 and isinstance(n.func, cst.Name) and n.func.value in functions:
            for r in astutil.walk(functions[n.func.value].body):
                if isinstance(r, cst.Return) and r.value is not None and _device_value(r.value, ctx, functions, 1):
                    return True
    return False


def _bound(fn: cst.FunctionDef, call: cst.Call) -> dict:
    params = _params(fn)
    bound = {}
    for i, a in enumerate(call.args):
        if a.star:
            break
        if a.keyword is not None:
            bound[a.keyword.value] = a.value
        elif i < len(params):
            bound[params[i]] = a.value
    return bound


def _offset_slices(fn: cst.FunctionDef, offset_params: set) -> list:
    """Subscripts of a parameter of ``fn`` at an offset parameter, not moved right away."""
    params = set(_params(fn))
    return [
        n for n in astutil.walk(fn.body)
        if isinstance(n, cst.Subscript) and isinstance(n.value, cst.Name) and n.value.value in params
        and n.value.value not in offset_params and any(_offset_index(n, p) for p in offset_params)
        and not _moved_in(fn, n)
    ]


def _length_read(fn: cst.FunctionDef, name: cst.Name) -> bool:
    """``len(name)`` or ``name.size(...)`` / ``name.shape``: reads of the shape only."""
    for n in astutil.walk(fn.body):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == "len" and len(n.args) == 1 and n.args[0].value is name:
            return True
        if isinstance(n, cst.Attribute) and n.value is name and n.attr.value in ("size", "shape", "dim", "ndim"):
            return True
    return False


def _from_placer(name: cst.Name, call: cst.Call, idx, functions: dict, placers: set, depth: int) -> bool:
    """Every value ``name`` (an argument of ``call``) may hold is the result of a call of a
    module function (added to ``placers``), followed through the parameters of the function
    the name sits in."""
    if depth > 3:
        return False
    fn = idx.call_scopes.get(id(call))  # the function, lambda or class holding the call (and its argument)
    if isinstance(fn, cst.FunctionDef) and name.value in _params(fn):
        calls = idx.calls_by_name.get(fn.name.value, ())
        if not calls:
            return False
        for c in calls:
            arg = _bound(fn, c).get(name.value)
            if not isinstance(arg, cst.Name) or not _from_placer(arg, c, idx, functions, placers, depth + 1):
                return False
        return True
    values = idx.values.get(name.value, ())
    if not values:
        return False
    for v in values:
        if not (isinstance(v, cst.Call) and isinstance(v.func, cst.Name) and v.func.value in functions):
            return False
        placers.add(v.func.value)
    return True


def _gatherable(sub: cst.Subscript) -> bool:
    """``x[a:b]`` / ``x[a:b:c]``: one slice of the first dimension, of a plain name."""
    return (isinstance(sub.value, (cst.Name, cst.Attribute)) and len(sub.slice) == 1
            and isinstance(sub.slice[0].slice, cst.Slice))


def _writes(body: cst.CSTNode, ctx) -> bool:
    """The code writes into a tensor in place: an in-place method (``x.add_(...)``, ``x.copy_``,
    not a library function such as ``torch.nn.utils.clip_grad_norm_``), an item assignment
    (``x[...] = ...``) or an augmented assignment of an item."""
    for n in astutil.walk(body):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute):
            m = n.func.attr.value
            if m.endswith("_") and not m.startswith("_") and ctx.qualname(n.func) is None:
                return True
        if isinstance(n, cst.AssignTarget) and isinstance(n.target, (cst.Subscript, cst.Attribute)):
            if isinstance(n.target, cst.Subscript):
                return True
        if isinstance(n, cst.AugAssign) and isinstance(n.target, cst.Subscript):
            return True
    return False


def _mutated_in(loop: cst.CSTNode, ctx) -> bool:
    """The loop writes into a tensor in place (see _writes), and so might write into a batch
    it took: the view a slice gives and the copy a gather gives would differ."""
    return _writes(loop.body, ctx)  # type: ignore[attr-defined]
