from typing import Iterator, Optional

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Rule, Severity

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

    There is no automatic fix, because where the data should live is a design choice: keep
    the source tensor on the CPU and move each slice (`source[i:i + n].to(device)`, a
    host-to-device upload per step, like a DataLoader's), or gather on the device with an
    index built on the CPU and moved (`source.index_select(0, torch.arange(i, i + n).to(device))`).
    """

    code = "TX306"
    name = "xla-loop-offset-slice"
    target = "torch-xla"
    summary = "device tensor sliced at a loop-varying offset: one compiled graph per offset (report only)"
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
            None,
            title="a language model's bptt loop",
        ),
        Example(
            """
            import torch

            X = torch.randn(96, 20, device=device)

            def fit(model):
                for i in range(0, 96, 8):
                    model(X[i:i + 8]).sum().backward()
            """,
            None,
            title="inline slicing of a device tensor",
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
                    self.report(
                        n,
                        f"`{name}` lives on the device and is indexed at the loop offset `{var}`: "
                        "XLA compiles one graph per offset; keep it on the CPU and move each slice "
                        f"(`{name}[...].to(device)`), or gather with index_select and an index built "
                        "on the CPU",
                    )
            elif isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value in functions:
                fn = functions[n.func.value]
                for tensor_arg in _sliced_by_offset(fn, n, var):
                    name = dotted_name(tensor_arg)
                    if name and self._on_device(tensor_arg, functions):
                        self.report(
                            n,
                            f"`{n.func.value}(...)` slices `{name}`, which lives on the "
                            f"device, at the loop offset `{var}`: XLA compiles one graph per offset; "
                            f"keep `{name}` on the CPU and move each slice in `{n.func.value}` "
                            "(`.to(device)`), or gather with index_select and an index built on the CPU",
                        )

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
