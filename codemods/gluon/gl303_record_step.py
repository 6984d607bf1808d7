from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc
from ._script import trainer_names

_RECORD = ("mxnet.autograd.record",)


def _expr_call(stmt: cst.CSTNode) -> Optional[cst.Call]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr):
        value = stmt.body[0].value
        if isinstance(value, cst.Call):
            return value
    return None


def _backward(stmt: cst.CSTNode) -> Optional[cst.Call]:
    call = _expr_call(stmt)
    if call is not None and astutil.method_name(call) == "backward":
        return call
    return None


_AUTOGRAD_BACKWARD = ("mxnet.autograd.backward",)


def _backward_pass(ctx, stmt: cst.CSTNode) -> Optional[cst.Call]:
    """The backward call of a statement that backpropagates the step's loss: ``loss.backward()``,
    a loop over the per-shard losses of a context list (``for l in loss: l.backward()``), or
    ``autograd.backward(losses)``."""
    call = _backward(stmt)
    if call is not None:
        return call
    if isinstance(stmt, cst.For) and isinstance(stmt.body, cst.IndentedBlock) and len(stmt.body.body) == 1 \
            and stmt.orelse is None and isinstance(stmt.target, cst.Name):
        inner = _backward(stmt.body.body[0])
        if inner is not None and isinstance(inner.func.value, cst.Name) and inner.func.value.value == stmt.target.value:
            return inner
    call = _expr_call(stmt)
    if call is not None and sc.call_name(ctx, call) in _AUTOGRAD_BACKWARD:
        return call
    return None


class GluonRecordStep(Rule):
    """
    ## What it does
    Turns Gluon's training step into PyTorch's, with `trainer.step(n)`'s scaling written out:

        with autograd.record():                 trainer.zero_grad()
            output = net(data)                  output = net(data)
            loss = loss_fn(output, label)  ->   loss = loss_fn(output, label)
        loss.backward()                         (loss.sum() / n).backward()
        trainer.step(n)                         trainer.step()

    (the loss and the trainer are translated by GL301 and GL302). Gluon's `backward()` on a
    loss of one value per sample sums them (its head gradient is ones), and
    `trainer.step(n)` divides the gradients by `n` before the update: `(loss.sum() /
    n).backward()` computes exactly those gradients, also for a ragged last batch with
    `n = data.shape[0]`. Gluon's default `grad_req="write"` overwrites gradients at each
    backward pass: `zero_grad()` before the forward pass gives the same. The block is the one
    that a `trainer.step(n)` of a `gluon.Trainer` follows in the same body, with exactly one
    `backward()` (inside the block or after it) before that step; statements between the
    backward and the step (gradient clipping, GL304) stay where they are. A loss computed in
    several record blocks before its one backward pass (a GAN's discriminator: the real
    batch's loss in one block, the generated batch's in the next) is one step: `zero_grad()`
    before the first block, every block's body in place.

    With a context list (Gluon's single-process data parallelism, one loss per shard; GL002
    and GL003 make it one device and one shard), `for l in loss: l.backward()` becomes
    `(sum(l.sum() for l in loss) / n).backward()` and `autograd.backward(losses)`
    `(sum(part.sum() for part in losses) / n).backward()`: one backward pass of the shards'
    summed loss, the gradients Gluon's trainer sums over its contexts (and one step for the
    JAX rules to make a `value_and_grad` step of).

    Reported: a `record()` block without such a step (a step in another function, several
    backward passes, `backward` with a head gradient), `record(train_mode=False)`, and
    `trainer.step(n, ignore_stale_grad=True)`.

    ## Why
    PyTorch has no recording scope: autograd records every operation on tensors that require
    gradients, gradients accumulate until `zero_grad()`, and the optimizer step does not
    rescale them.

    ## Fix safety
    Safe: the same gradients and the same update.
    """

    code = "GL303"
    name = "gluon-record-step"
    target = "torch"
    summary = "with autograd.record(): ... loss.backward(); trainer.step(n) -> zero_grad(), forward, (loss.sum() / n).backward(), step()"
    severity = Severity.ERROR
    needs_text = ("record",)
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            from mxnet import autograd, gluon

            trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
            for data, label in train_data:
                with autograd.record():
                    output = net(data)
                    loss = loss_fn(output, label)
                loss.backward()
                trainer.step(data.shape[0])
            """,
            """
            from mxnet import gluon

            trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
            for data, label in train_data:
                trainer.zero_grad()
                output = net(data)
                loss = loss_fn(output, label)
                (loss.sum() / data.shape[0]).backward()
                trainer.step()
            """,
            title="the trainer itself is GL302's",
        ),
        Example(
            """
            from mxnet import autograd as ag, gluon

            trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
            for batch in train_data:
                data = gluon.utils.split_and_load(batch[0], ctx_list=ctx)
                label = gluon.utils.split_and_load(batch[1], ctx_list=ctx)
                with ag.record():
                    output = [net(X) for X in data]
                    loss = [loss_fn(yhat, y) for yhat, y in zip(output, label)]
                for l in loss:
                    l.backward()
                trainer.step(batch_size)
            for batch in train_data:
                with ag.record():
                    losses = [loss_fn(net(X), y) for X, y in zip(*batch)]
                    ag.backward(losses)
                trainer.step(batch_size * 2)
            """,
            """
            from mxnet import gluon

            trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
            for batch in train_data:
                data = gluon.utils.split_and_load(batch[0], ctx_list=ctx)
                label = gluon.utils.split_and_load(batch[1], ctx_list=ctx)
                trainer.zero_grad()
                output = [net(X) for X in data]
                loss = [loss_fn(yhat, y) for yhat, y in zip(output, label)]
                (sum(l.sum() for l in loss) / batch_size).backward()
                trainer.step()
            for batch in train_data:
                trainer.zero_grad()
                losses = [loss_fn(net(X), y) for X, y in zip(*batch)]
                (sum(part.sum() for part in losses) / (batch_size * 2)).backward()
                trainer.step()
            """,
            title="per-shard losses of a context list (split_and_load is GL003's)",
        ),
        Example(
            """
            from mxnet import autograd, gluon

            trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 2e-4})
            for data in loader:
                with autograd.record():
                    err_real = loss_fn(net(data), real_label)
                metric.update([real_label], [net(data)])
                with autograd.record():
                    err_fake = loss_fn(net(generator(noise).detach()), fake_label)
                    err = err_real + err_fake
                err.backward()
                trainer.step(batch_size)
            """,
            """
            from mxnet import gluon

            trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 2e-4})
            for data in loader:
                trainer.zero_grad()
                err_real = loss_fn(net(data), real_label)
                metric.update([real_label], [net(data)])
                err_fake = loss_fn(net(generator(noise).detach()), fake_label)
                err = err_real + err_fake
                (err.sum() / batch_size).backward()
                trainer.step()
            """,
            title="a loss computed in several record blocks before its one backward pass (a GAN's discriminator)",
        ),
        Example(
            """
            from mxnet import autograd

            def train_step(net, data):
                with autograd.record():
                    loss = net(data).sum()
                loss.backward()
                return loss
            """,
            None,
            title="no trainer.step in the same body: reported",
        ),
    ]
    valid = ["import torch\nwith torch.no_grad():\n    y = net(x)\n"]

    def visit_With(self, node: cst.With) -> None:
        if len(node.items) != 1:
            return
        item = node.items[0].item
        if not (isinstance(item, cst.Call) and sc.call_name(self.ctx, item) in _RECORD):
            return
        if item.args:
            self.report(node, "autograd.record() with arguments (train_mode=False): translate by hand")
            return
        if node.items[0].asname is not None or not isinstance(node.body, cst.IndentedBlock):
            self.report(node, "this autograd.record() block: translate by hand")
            return
        if self._continues_a_step(node):
            return
        plan = self._plan(node)
        if isinstance(plan, str):
            self.report(node, f"autograd.record(): {plan}; translate by hand (zero_grad, forward, backward of the "
                        "loss summed and divided by trainer.step's n, step())")
            return
        backward, step, trainer, n, loop, records = plan
        function_form = sc.call_name(self.ctx, backward) in _AUTOGRAD_BACKWARD
        zero = cst.parse_statement(f"{trainer}.zero_grad()")

        def unwrap(u: cst.With) -> cst.FlattenSentinel:
            first = zero.with_changes(leading_lines=u.leading_lines)
            return cst.FlattenSentinel([first, *u.body.body])

        def scaled(u: cst.Call) -> cst.BaseExpression:
            if function_form:  # autograd.backward(losses)
                losses = sc.code(u.args[0].value)
                return sc.expr(f"(sum(part.sum() for part in {losses}) / {sc.code(_paren_if_binary(n))}).backward()")
            loss = u.func.value
            summed = cst.Call(cst.Attribute(loss if isinstance(loss, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))
                                            else loss.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]),
                                            cst.Name("sum")))
            div = cst.BinaryOperation(summed, cst.Divide(), _paren_if_binary(n), lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            return u.with_changes(func=u.func.with_changes(value=div))

        def summed(u: cst.For) -> cst.BaseStatement:  # for l in loss: l.backward() -> one backward of the sum
            part, losses = sc.code(u.target), sc.code(u.iter)
            return cst.parse_statement(f"(sum({part}.sum() for {part} in {losses}) / {sc.code(_paren_if_binary(n))}).backward()\n"
                                       ).with_changes(leading_lines=u.leading_lines)

        def unwrap_more(u: cst.With) -> cst.FlattenSentinel:
            body = list(u.body.body)
            body[0] = body[0].with_changes(leading_lines=[*u.leading_lines, *body[0].leading_lines])
            return cst.FlattenSentinel(body)

        edits = (self.replace(node, unwrap), *(self.replace(r, unwrap_more) for r in records),
                 self.replace(loop, summed) if loop is not None else self.replace(backward, scaled),
                 self.replace(step, lambda u: u.with_changes(args=[])))
        self.report(node, "autograd.record() + backward() + trainer.step(n) -> zero_grad(), (loss.sum() / n).backward(), step()",
                    Fix(edits))

    def _plan(self, node: cst.With):
        parent = self.ctx.parent
        body = getattr(parent, "body", None)
        if not isinstance(body, (list, tuple)) or node not in body:
            return "not in a block porter can read"
        after = list(body[list(body).index(node) + 1:])
        inner = [s for s in node.body.body if _backward_pass(self.ctx, s) is not None]
        backwards = list(inner)
        records: list[cst.With] = []  # more record blocks of the same step (a loss in parts)
        step = None
        trainers = trainer_names(self.ctx)
        for stmt in after:
            call = _expr_call(stmt)
            if call is not None and astutil.method_name(call) == "step" and dotted_name(call.func.value) in trainers:
                step = call
                break
            if _backward_pass(self.ctx, stmt) is not None:
                backwards.append(stmt)
            if self._is_record(stmt):
                if backwards:
                    break  # a forward after the backward pass: another step's
                if stmt.items[0].item.args or stmt.items[0].asname is not None or not isinstance(  # type: ignore[attr-defined]
                        stmt.body, cst.IndentedBlock):
                    return "a second autograd.record() block of this step that porter cannot read"
                records.append(stmt)
                backwards.extend(s for s in stmt.body.body if _backward_pass(self.ctx, s) is not None)
        if step is None:
            return "no trainer.step(n) of a gluon.Trainer follows it in the same body"
        if len(backwards) != 1:
            return f"{len(backwards)} backward() calls before trainer.step()"
        backward = _backward_pass(self.ctx, backwards[0])
        if sc.call_name(self.ctx, backward) in _AUTOGRAD_BACKWARD:
            if len(backward.args) != 1 or backward.args[0].keyword is not None or backward.args[0].star:
                return "autograd.backward() with a head gradient"
        elif backward.args:
            return "backward() with a head gradient"
        if len(step.args) != 1 or step.args[0].keyword not in (None,) and step.args[0].keyword.value != "batch_size":
            return "trainer.step() with arguments other than the batch size"
        trainer = dotted_name(step.func.value)
        loop = backwards[0] if isinstance(backwards[0], cst.For) else None
        return backward, step, trainer, step.args[0].value, loop, records

    def _is_record(self, stmt: cst.CSTNode) -> bool:
        return isinstance(stmt, cst.With) and len(stmt.items) == 1 and isinstance(stmt.items[0].item, cst.Call) \
            and sc.call_name(self.ctx, stmt.items[0].item) in _RECORD

    def _continues_a_step(self, node: cst.With) -> bool:
        """``node`` is a later record block of a step an earlier block of the same body begins
        (no backward pass and no trainer step between them): that block's fix takes it."""
        body = getattr(self.ctx.parent, "body", None)
        if not isinstance(body, (list, tuple)) or node not in body:
            return False
        trainers = trainer_names(self.ctx)
        for stmt in reversed(list(body)[:list(body).index(node)]):
            call = _expr_call(stmt)
            if _backward_pass(self.ctx, stmt) is not None or (
                    call is not None and astutil.method_name(call) == "step" and dotted_name(call.func.value) in trainers):
                return False
            if self._is_record(stmt):
                return not any(_backward_pass(self.ctx, s) is not None for s in stmt.body.body)  # type: ignore[attr-defined]
        return False


def _paren_if_binary(n: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(n, cst.BinaryOperation):
        return n.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return n
