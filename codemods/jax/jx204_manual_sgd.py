from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.astutil import code
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity

from . import _ops_table as ops

_NO_GRAD = ("torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad")


class ManualSGD(Rule):
    """
    ## What it does
    Rewrites a hand-written SGD update over a model's parameters into a torch optimizer, which
    the other JAX rules then port with the rest of the training step (JX201: optax.sgd with
    the script's rate; JX301: one jitted `train_step`):

        for p in model.parameters():          ->  optimizer.step()
            p.data -= lr * p.grad

    and a `torch.optim.SGD(model.parameters(), lr=lr)` built before the training loop.
    The update may be spelled `p.data.add_(p.grad, alpha=-lr)`, `p.data.add_(-lr, p.grad)`,
    `p.data.sub_(lr * p.grad)`, `p.data -= lr * p.grad(.data)`, `p -= lr * p.grad`,
    `p.data = p.data - lr * p.grad` (`p.grad * lr` too), inside `with torch.no_grad():` or
    not; `p.grad.zero_()` / `p.grad.data.zero_()` / `p.grad = None` in the same loop
    become `optimizer.zero_grad()` after the step, and `model.zero_grad()` in the training
    loop `optimizer.zero_grad()`. A rate the script changes (a name assigned more than once
    in the file or in a loop, `lr *= 0.1`, `lr /= 4.0` on a plateau) is set in the optimizer
    before each step (`for group in optimizer.param_groups: group['lr'] = lr`, which JX202
    and JX201 port as `optax.inject_hyperparams` state), so each update uses the value the
    loop read; a changing rate with no value before the training loop (first bound inside
    it) is reported.

    ## Why
    A JAX training step updates parameters inside the jitted function that computes the
    gradients; a Python loop over `p.grad` has no JAX counterpart (JAX arrays have no
    `.grad`, and NNX parameters are updated through an optimizer or `nnx.update`).

    ## Fix safety
    Safe: `torch.optim.SGD(lr)` without momentum or weight decay computes
    `p.add_(p.grad, alpha=-lr)`, the same update, and `optimizer.zero_grad()` /
    `model.zero_grad()` both drop the gradients of the same parameters; the rewritten script
    still runs in torch.
    """

    code = "JX204"
    name = "manual-sgd-to-optimizer"
    target = "jax"
    summary = "for p in model.parameters(): p.data -= lr * p.grad -> torch.optim.SGD + optimizer.step() (then ported with the step)"
    severity = Severity.ERROR
    needs_text = (".grad",)
    examples = [
        Example(
            """
            import torch

            def train(model, loader, lr):
                for x, y in loader:
                    model.zero_grad()
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    with torch.no_grad():
                        for p in model.parameters():
                            p -= lr * p.grad
            """,
            """
            import torch

            def train(model, loader, lr):
                optimizer = torch.optim.SGD(model.parameters(), lr=lr)
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    optimizer.step()
            """,
            title="p -= lr * p.grad under torch.no_grad()",
        ),
        Example(
            """
            import torch

            learning_rate = 0.01
            for epoch in range(3):
                for x, y in loader:
                    loss = criterion(net(x), y)
                    loss.backward()
                    for f in net.parameters():
                        f.data.add_(f.grad.data, alpha=-learning_rate)
                        f.grad.data.zero_()
            """,
            """
            import torch

            learning_rate = 0.01
            optimizer = torch.optim.SGD(net.parameters(), lr=learning_rate)
            for epoch in range(3):
                for x, y in loader:
                    loss = criterion(net(x), y)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            title="p.data.add_(p.grad.data, alpha=-lr) and p.grad.data.zero_()",
        ),
        Example(
            """
            import torch

            lr = 0.1
            for epoch in range(10):
                for x, y in loader:
                    model.zero_grad()
                    criterion(model(x), y).backward()
                    for p in model.parameters():
                        p.data.sub_(lr * p.grad)
                lr *= 0.5
            """,
            """
            import torch

            lr = 0.1
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            for epoch in range(10):
                for x, y in loader:
                    optimizer.zero_grad()
                    criterion(model(x), y).backward()
                    for group in optimizer.param_groups:
                        group['lr'] = lr
                    optimizer.step()
                lr *= 0.5
            """,
            title="a rate the script changes: set in the optimizer before each step (JX202/JX201: "
                  "optax.inject_hyperparams and its state)",
        ),
        Example(
            """
            import torch

            for epoch in range(10):
                lr = 0.1 * 0.5 ** epoch
                for x, y in loader:
                    model.zero_grad()
                    criterion(model(x), y).backward()
                    for p in model.parameters():
                        p.data.sub_(lr * p.grad)
            """,
            """
            import torch

            for epoch in range(10):
                lr = 0.1 * 0.5 ** epoch
                for x, y in loader:
                    model.zero_grad()
                    criterion(model(x), y).backward()
                    for p in model.parameters():  # porter: manual
                        p.data.sub_(lr * p.grad)
            """,
            title="a rate first bound inside the training loop (no value to build the optimizer with): reported",
        ),
    ]
    valid = [
        "import torch\nfor p in model.parameters():\n    p.requires_grad = False\n",
        "import torch\nfor p in model.parameters():\n    print(p.grad.norm())\n",
    ]

    def visit_For(self, node: cst.For) -> None:
        got = _update_loop(node)
        if got is None:
            return
        model, param, lr, zeroes = got
        ctx = self.ctx
        stmt = node
        # `with torch.no_grad():` holding only this loop goes with it
        with_stmt = ctx.enclosing(cst.With)
        if with_stmt is not None and isinstance(with_stmt.body, cst.IndentedBlock) and len(with_stmt.body.body) == 1 \
                and with_stmt.body.body[0] is node and all((ctx.qualname(i.item.func if isinstance(i.item, cst.Call) else i.item) or "") in _NO_GRAD
                                                           for i in with_stmt.items):
            stmt = with_stmt
        train_loop = _outermost_loop(ctx, stmt)
        if train_loop is None:
            return
        changes = _changes(ctx.module, lr)
        if changes and not _bound_before(ctx, lr, train_loop):
            self.report(node, f"manual SGD update with a rate the script changes ({code(lr)}), not bound before the "
                              "training loop: port with an optax schedule or inject_hyperparams by hand",
                        None if _marked(node) else Fix((Edit(node, _mark_header),), description="mark the line # porter: manual"))
            return
        name = "optimizer" if "optimizer" not in _bound_names(ctx.module) else "sgd_optimizer"
        torch_name = ctx.module_alias("torch")
        new_opt = cst.parse_statement(f"{name} = {torch_name}.optim.SGD({model}.parameters(), lr={ops.bare(lr)})")
        step = cst.parse_statement(f"{name}.step()")
        replacement = [step.with_changes(leading_lines=stmt.leading_lines)]
        if changes:
            # the rate of each update, as the loop read it: set in the optimizer before its step
            # (JX202 and JX201 port that as optax.inject_hyperparams and its state)
            replacement = [cst.parse_statement(f"for group in {name}.param_groups:\n    group['lr'] = {ops.bare(lr)}\n")
                           .with_changes(leading_lines=stmt.leading_lines), step]
        if zeroes:
            replacement.append(cst.parse_statement(f"{name}.zero_grad()"))
        edits = [Edit(stmt, cst.FlattenSentinel(replacement)), Edit(train_loop, _insert_before(new_opt))]
        # model.zero_grad() in the training loop -> optimizer.zero_grad() (JX301 recognises it)
        for n in astutil.walk(train_loop.body):
            if isinstance(n, cst.Call) and astutil.method_name(n) == "zero_grad" and code(n.func.value) == model and not n.args:  # type: ignore[attr-defined]
                edits.append(Edit(n.func.value, cst.Name(name)))  # type: ignore[attr-defined]
        self.report(node, f"manual SGD update of {model}'s parameters -> torch.optim.SGD(lr={code(lr)}) and {name}.step() "
                          "(ported with the training step)", Fix(tuple(edits), Safety.SAFE, ("torch",)))


def _bound_before(ctx, lr: cst.CSTNode, loop: cst.CSTNode) -> bool:
    """The rate can be read where the optimizer is built, before ``loop``: an attribute of a
    name (`args.lr`); a name the loop's function assigns before the loop; or, in a function
    that does not assign it, a module-level name (read as the function runs)."""
    root = astutil.root_name(lr)
    if root is None:
        return False
    if not isinstance(lr, cst.Name):
        return True
    fn = ctx.enclosing(cst.FunctionDef)
    if fn is not None and not any(root in astutil.binds(n) for n in astutil.walk(fn.body)):
        return any(root in astutil.binds(stmt) for stmt in ctx.module.body)
    body = fn.body.body if fn is not None else ctx.module.body
    for stmt in body:
        if stmt is loop or any(a is stmt for a in ctx.ancestors):
            return False
        if root in astutil.binds(stmt):
            return True
    return False


def _marked(node: cst.For) -> bool:
    header = node.body.header if isinstance(node.body, cst.IndentedBlock) else None
    return header is not None and header.comment is not None and ops.MANUAL_MARK in header.comment.value


def _mark_header(updated: cst.For) -> cst.For:
    text = f"# {ops.MANUAL_MARK}"
    body = updated.body
    if isinstance(body, cst.IndentedBlock) and body.header.comment is None:
        return updated.with_changes(body=body.with_changes(header=body.header.with_changes(
            whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(text))))
    return updated


def _insert_before(stmt: cst.BaseStatement):
    def apply(updated):
        return cst.FlattenSentinel([stmt.with_changes(leading_lines=updated.leading_lines),
                                    updated.with_changes(leading_lines=[])])
    return apply


def _outermost_loop(ctx, stmt) -> Optional[cst.CSTNode]:
    """The outermost loop around ``stmt`` within its function (or the module): the optimizer is
    built before it."""
    found = None
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            break
        if isinstance(anc, (cst.For, cst.While)) and anc is not stmt:
            found = anc
    return found


def _bound_names(module: cst.Module) -> set:
    out = set()
    for n in astutil.walk(module, into_functions=True):
        if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in n.targets] if isinstance(n, cst.Assign) else [n.target]
            for t in targets:
                out.add(code(t))
        elif isinstance(n, cst.Param):
            out.add(n.name.value)
    return out


def _changes(module: cst.Module, lr: cst.CSTNode) -> bool:
    """The rate is a name (or attribute) the file assigns more than once, or changes in place."""
    if not isinstance(lr, (cst.Name, cst.Attribute)):
        return not isinstance(lr, (cst.Integer, cst.Float))
    text = code(lr)
    count = 0
    for n in astutil.walk(module, into_functions=True):
        if isinstance(n, cst.AugAssign) and code(n.target) == text:
            return True
        if isinstance(n, cst.Assign):
            for t in n.targets:
                elts = t.target.elements if isinstance(t.target, (cst.Tuple, cst.List)) else [t.target]
                for e in elts:
                    e = e.value if isinstance(e, cst.Element) else e
                    if code(e) == text:
                        count += 1
        if isinstance(n, cst.For) and code(n.target) == text:
            return True
        if isinstance(n, (cst.For, cst.While)) and any(
                isinstance(m, cst.Assign) and any(code(t.target) == text for t in m.targets)
                for m in astutil.walk(n.body)):
            return True  # assigned in a loop: a new value each time round (`lr = base * 0.5 ** epoch`)
    return count > 1


def _is_grad(node: cst.CSTNode, p: str) -> bool:
    """``p.grad`` or ``p.grad.data``."""
    if isinstance(node, cst.Attribute) and node.attr.value == "data":
        node = node.value
    return isinstance(node, cst.Attribute) and node.attr.value == "grad" and code(node.value) == p


def _is_param(node: cst.CSTNode, p: str) -> bool:
    """``p`` or ``p.data``."""
    if isinstance(node, cst.Attribute) and node.attr.value == "data":
        node = node.value
    return isinstance(node, cst.Name) and node.value == p


def _scaled_grad(node: cst.CSTNode, p: str) -> Optional[cst.CSTNode]:
    """``lr * p.grad`` / ``p.grad * lr`` -> lr."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        if _is_grad(node.right, p):
            return node.left
        if _is_grad(node.left, p):
            return node.right
    return None


def _negated(node: cst.CSTNode) -> Optional[cst.CSTNode]:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return node.expression.with_changes(lpar=[], rpar=[]) if not node.lpar else node.expression
    return None


def _update_rate(small: cst.BaseSmallStatement, p: str) -> Optional[cst.CSTNode]:
    """The learning rate of one update statement on parameter ``p``, else None."""
    if isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.SubtractAssign) and _is_param(small.target, p):
        return _scaled_grad(small.value, p)
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and _is_param(small.targets[0].target, p):
        v = small.value
        if isinstance(v, cst.BinaryOperation) and isinstance(v.operator, cst.Subtract) and _is_param(v.left, p) \
                and code(v.left) == code(small.targets[0].target):
            return _scaled_grad(v.right, p)
        return None
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        call = small.value
        m = astutil.method_name(call)
        if m not in ("add_", "sub_") or not _is_param(call.func.value, p):  # type: ignore[attr-defined]
            return None
        args = call.args
        if m == "sub_" and len(args) == 1 and args[0].keyword is None:
            return _scaled_grad(args[0].value, p)
        if m == "add_":
            if len(args) == 2 and _is_grad(args[0].value, p) and args[1].keyword is not None and args[1].keyword.value == "alpha":
                return _negated(args[1].value)
            if len(args) == 2 and args[0].keyword is None and args[1].keyword is None and _is_grad(args[1].value, p):
                return _negated(args[0].value)  # the old add_(-lr, grad)
            if len(args) == 1 and args[0].keyword is None:
                v = args[0].value
                inner = _negated(v)
                if inner is not None:
                    return _scaled_grad(inner, p)
                if isinstance(v, cst.BinaryOperation) and isinstance(v.operator, cst.Multiply):
                    lr = _negated(v.left)
                    if lr is not None and _is_grad(v.right, p):
                        return lr
    return None


def _zeroes(small: cst.BaseSmallStatement, p: str) -> bool:
    """``p.grad.zero_()``, ``p.grad.data.zero_()``, ``p.grad = None``."""
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and astutil.method_name(small.value) == "zero_" \
            and not small.value.args:
        return _is_grad(small.value.func.value, p)  # type: ignore[attr-defined]
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Name) \
            and small.value.value == "None":
        t = small.targets[0].target
        return isinstance(t, cst.Attribute) and t.attr.value == "grad" and code(t.value) == p
    return False


def _update_loop(node: cst.For):
    """(model, parameter name, rate, zeroes the gradients) of ``for p in model.parameters():``
    whose body is one SGD update (and optionally the gradient's zeroing), else None."""
    it = node.iter
    if not (isinstance(it, cst.Call) and astutil.method_name(it) == "parameters" and not it.args
            and isinstance(node.target, cst.Name) and node.orelse is None and isinstance(node.body, cst.IndentedBlock)):
        return None
    p = node.target.value
    rate = None
    zeroes = False
    for st in node.body.body:
        if not isinstance(st, cst.SimpleStatementLine):
            return None
        for small in st.body:
            r = _update_rate(small, p)
            if r is not None and rate is None:
                rate = r
            elif _zeroes(small, p) and rate is not None:
                zeroes = True
            else:
                return None
    if rate is None:
        return None
    return code(it.func.value), p, rate, zeroes  # type: ignore[attr-defined]
