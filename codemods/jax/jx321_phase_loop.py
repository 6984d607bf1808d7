from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp


class PhaseLoop(Rule):
    """
    ## What it does
    Splits a loop that trains only in one phase into one loop per phase. A loop whose body
    steps the optimizer under a condition that the loop does not change (the classic
    train/val loop: `for inputs, labels in dataloaders[phase]:` with
    `with torch.set_grad_enabled(phase == 'train'):` around the forward pass and
    `if phase == 'train': loss.backward(); optimizer.step()` inside) becomes
    `if phase == 'train': <the loop, training> else: <the loop, evaluating>`: in the training
    loop the `if` keeps its body and the grad mode is on (the `with` goes); in the evaluation
    loop the `if` keeps its `else` (or nothing), the `with` becomes `torch.no_grad()`, and the
    optimizer's `zero_grad()` goes (no gradient is computed there).

    ## Why
    The JAX training step is a jitted function of the loop body's forward pass, loss and
    update (JX301): a backward pass nested in a condition of the loop body has no such form
    ("loss.backward() is nested in a block of the loop body"), and the port left the loop
    torch. With one loop per phase the training loop gets its jitted step and the evaluation
    loop runs the model forward only, as the original does in each phase.

    ## Fix safety
    Safe: the condition reads only names the loop does not bind and calls nothing, so every
    iteration of the loop takes the same branch; the split loop runs the same statements in
    the same order in each phase. The `zero_grad()` dropped from the evaluation loop cleared
    gradients that the next training loop clears again before its backward pass; where the
    file reads `.grad` anywhere, that drop is unsafe.
    """

    code = "JX321"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-phase-loop"
    target = "jax"
    summary = "a loop training under a loop-invariant condition (train/val phases) -> one loop per phase"
    severity = Severity.ERROR
    needs_text = ("backward",)
    examples = [
        Example(
            """
            import torch

            def run(model, criterion, optimizer, loaders):
                for phase in ["train", "val"]:
                    for inputs, labels in loaders[phase]:
                        optimizer.zero_grad()
                        with torch.set_grad_enabled(phase == "train"):
                            outputs = model(inputs)
                            loss = criterion(outputs, labels)
                            if phase == "train":
                                loss.backward()
                                optimizer.step()
                        print(loss.item())
            """,
            """
            import torch

            def run(model, criterion, optimizer, loaders):
                for phase in ["train", "val"]:
                    if phase == "train":
                        for inputs, labels in loaders[phase]:
                            optimizer.zero_grad()
                            outputs = model(inputs)
                            loss = criterion(outputs, labels)
                            loss.backward()
                            optimizer.step()
                            print(loss.item())
                    else:
                        for inputs, labels in loaders[phase]:
                            with torch.no_grad():
                                outputs = model(inputs)
                                loss = criterion(outputs, labels)
                            print(loss.item())
            """,
            title="the train/val loop of a phase",
        ),
        Example(
            """
            import torch

            def epoch(model, optimizer, loader, training):
                for x, y in loader:
                    loss = model(x, y)
                    if training:
                        loss.backward()
                        optimizer.step()
                    else:
                        print("eval", loss.item())
            """,
            """
            import torch

            def epoch(model, optimizer, loader, training):
                if training:
                    for x, y in loader:
                        loss = model(x, y)
                        loss.backward()
                        optimizer.step()
                else:
                    for x, y in loader:
                        loss = model(x, y)
                        print("eval", loss.item())
            """,
            title="a training flag given to the function",
        ),
    ]
    valid = [
        # the condition changes in the loop: not invariant
        "import torch\nfor i, (x, y) in enumerate(loader):\n    loss = model(x, y)\n    if i % 2 == 0:\n"
        "        loss.backward()\n        opt.step()\n",
        # the condition calls something
        "import torch\nfor x, y in loader:\n    loss = model(x, y)\n    if should_train():\n        loss.backward()\n"
        "        opt.step()\n",
    ]

    def visit_For(self, node: cst.For) -> None:
        if node.orelse is not None or not isinstance(node.body, cst.IndentedBlock) or node.asynchronous:
            return
        stmts = list(node.body.body)
        test = lp.phase_test(node, self.ctx)
        if test is None:
            return
        torch = self.ctx.module_alias("torch")
        train = _specialize(stmts, test, True, torch, self.ctx)
        evaluate = _specialize(stmts, test, False, torch, self.ctx)
        text = astutil.code(test)
        loops = [node.with_changes(body=node.body.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])]),
                                   leading_lines=[]) for body in (train, evaluate)]
        new = cst.If(test=test, body=cst.IndentedBlock([loops[0]]), orelse=cst.Else(cst.IndentedBlock([loops[1]])),
                     leading_lines=node.leading_lines)
        reads_grad = any(isinstance(n, cst.Attribute) and n.attr.value == "grad" for n in astutil.walk(self.ctx.module))
        dropped = any(_zero_grad(s, _stepped(stmts)) for s in stmts)
        self.report(node, f"the loop trains only when {text}, which the loop does not change: one loop per case, a "
                          "training loop (its step becomes a jitted function) and an evaluation loop",
                    Fix((self.replace(node, new),), Safety.UNSAFE if reads_grad and dropped else Safety.SAFE))


def _stepped(stmts) -> set[str]:
    """The optimizers the statements step (``optimizer.step()``)."""
    return {astutil.code(n.func.value) for s in stmts for n in astutil.walk(s)  # type: ignore[attr-defined]
            if isinstance(n, cst.Call) and astutil.method_name(n) == "step" and not n.args}


def _zero_grad(stmt: cst.BaseStatement, optimizers: set[str]) -> bool:
    """``optimizer.zero_grad()`` (a statement) of one of ``optimizers``."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Expr):
        return False
    call = stmt.body[0].value
    return isinstance(call, cst.Call) and astutil.method_name(call) == "zero_grad" \
        and astutil.code(call.func.value) in optimizers  # type: ignore[attr-defined]


def _specialize(stmts, test: cst.BaseExpression, value: bool, torch: str, ctx, optimizers: Optional[set] = None) -> list:
    """The loop body for one value of ``test``: its `if`s on it keep one branch; a
    `with torch.set_grad_enabled(test)` is inlined (True) or becomes `torch.no_grad()` (False)."""
    key = astutil.code(test)
    optimizers = _stepped(stmts) if optimizers is None else optimizers
    out: list = []

    def add(kept, first: cst.BaseStatement) -> None:
        kept = list(kept)
        if kept and first.leading_lines:
            kept[0] = kept[0].with_changes(leading_lines=[*first.leading_lines, *kept[0].leading_lines])
        out.extend(kept)

    for s in stmts:
        mode = lp.grad_mode(s, ctx)
        if mode is not None and astutil.code(mode) == key and isinstance(s.body, cst.IndentedBlock):
            inner = _specialize(list(s.body.body), test, value, torch, ctx, optimizers)
            if value:
                add(inner, s)
            elif inner:
                item = s.items[0].with_changes(item=cst.parse_expression(f"{torch}.no_grad()"))
                out.append(s.with_changes(items=[item], body=s.body.with_changes(body=inner)))
            continue
        if isinstance(s, cst.If) and astutil.code(s.test) == key:
            if value:
                add(s.body.body, s)  # type: ignore[union-attr]
            elif isinstance(s.orelse, cst.Else):
                add(s.orelse.body.body, s)  # type: ignore[union-attr]
            elif isinstance(s.orelse, cst.If):
                out.append(s.orelse.with_changes(leading_lines=s.leading_lines))
            continue
        if not value and _zero_grad(s, optimizers):
            continue  # no gradient in the evaluation loop
        out.append(s)
    return out
