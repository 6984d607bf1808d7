from __future__ import annotations

import libcst as cst

from porter.astutil import walk
from porter.rules import Example, Fix, Rule, Severity

from ._meters import instance_class, method, prints
from ._host_sync import (
    bound_names, loop_tensors, free_reads, is_logging_call, outermost_loop, reads_tensor_value, step_loop,
    syncs_each_step,
)


class LogInStepClosure(Rule):
    """
    ## What it does
    Wraps a logging call in the training/evaluation step that reads tensor values
    (`print(f'... {loss.item():.4f}')`, `logger.info(...)`, `pbar.set_postfix(loss=loss.item())`,
    `writer.add_scalar(...)`) in `xm.add_step_closure`, so that it runs after the step's graph
    has executed:

        xm.add_step_closure(lambda step, loss: print(step, loss.item()), args=(step, loss))

    (a lambda for a short line with at most two values of the iteration; otherwise a named
    local function, `def log_step(epoch, batch_idx, loss): print(...)`, registered with
    `xm.add_step_closure(log_step, args=(epoch, batch_idx, loss))`).

    The message text is unchanged. Names the loop rebinds (the loop variables, the loss, the
    batch, counters) are passed as `args`, so the closure sees this step's values even though
    it runs later; names the loop does not rebind are read from the enclosing scope. The
    wrapped call sits inside a lambda (or the local function), outside the step, so porter does
    not wrap it again.

    A call of a method that prints, on an object of a class defined in the file
    (pytorch/examples' `progress.display(i + 1)`, whose `ProgressMeter.display` body calls
    `print`), is wrapped too: the object is bound by `progress = ProgressMeter(...)` in the
    same function and the method's own body calls `print(...)` or a `logging`/`logger`
    method. It formats whatever the object holds (meters kept on the device by TX406), so it
    becomes `xm.add_step_closure(progress.display, args=(i + 1,))`: the arguments are
    evaluated in the step, the method runs at the step marker.

    A call under `if batch_idx % log_interval == 0:` stays under it: only logging steps
    register a closure, and only they transfer.

    Closures run at the step marker, so the fix is made only in a loop that has one
    (`torch_xla.sync()`, `xm.optimizer_step(opt, barrier=True)`, or iterating a
    `pl.MpDeviceLoader`); in a full `porter migrate` TX202/TX301 add it first and this rule
    wraps the call in the next pass. Without a marker the call is reported only: a closure
    would wait for whatever sync comes next, possibly none.

    ## Why
    On XLA, `.item()` or formatting a tensor inside the step executes the pending graph early
    and copies to the host: an extra graph execution, often an extra compilation, and a
    device-to-host transfer. A step closure runs at `torch_xla.sync()`, when the values
    already exist on the device: the only cost left is the copy of the values printed.

    ## Fix safety
    Safe: the same message is printed with the same tensor values, once the step's graph has
    run; the line appears at the step marker rather than in the middle of the step. Names
    the loop does not rebind are read when the closure runs, so a clock in the message
    (`time.time() - start`) is read a little later than before. A `break` or `return` right
    after the call (`if args.dry_run: break`) skips the loop's own marker: the line then
    prints at the next sync of the program (an evaluation loop's, typically), and not at all
    if none follows.
    """

    code = "TX402"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "log-in-step-closure"
    target = "torch-xla"
    summary = "print/log of tensor values in the step -> xm.add_step_closure(...)"
    severity = Severity.WARNING
    needs_text = ("backward", "no_grad", "inference_mode")  # a step loop runs a backward pass or sits under no_grad
    examples = [
        Example(
            """
            import torch
            import torch_xla

            def train(model, loader, optimizer, epoch, log_interval):
                for batch_idx, (data, target) in enumerate(loader):
                    optimizer.zero_grad()
                    loss = model(data, target)
                    loss.backward()
                    optimizer.step()
                    if batch_idx % log_interval == 0:
                        print(f'Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]\\tLoss: {loss.item():.6f}')
                    torch_xla.sync()
            """,
            """
            import torch
            import torch_xla
            import torch_xla.core.xla_model as xm

            def train(model, loader, optimizer, epoch, log_interval):
                for batch_idx, (data, target) in enumerate(loader):
                    optimizer.zero_grad()
                    loss = model(data, target)
                    loss.backward()
                    optimizer.step()
                    if batch_idx % log_interval == 0:
                        def log_step(batch_idx, data, loss):
                            print(f'Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]\\tLoss: {loss.item():.6f}')
                        xm.add_step_closure(log_step, args=(batch_idx, data, loss))
                    torch_xla.sync()
            """,
        ),
        Example(
            """
            import logging
            import torch
            import torch_xla.distributed.parallel_loader as pl

            logger = logging.getLogger(__name__)

            def train(model, loader, device, optimizer, pbar):
                for step, (x, y) in enumerate(pl.MpDeviceLoader(loader, device)):
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    pbar.set_postfix(loss=loss.item())
                    logger.info('step %d loss %.4f', step, loss)
            """,
            """
            import logging
            import torch
            import torch_xla.distributed.parallel_loader as pl
            import torch_xla.core.xla_model as xm

            logger = logging.getLogger(__name__)

            def train(model, loader, device, optimizer, pbar):
                for step, (x, y) in enumerate(pl.MpDeviceLoader(loader, device)):
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    xm.add_step_closure(lambda loss: pbar.set_postfix(loss=loss.item()), args=(loss,))
                    xm.add_step_closure(lambda step, loss: logger.info('step %d loss %.4f', step, loss), args=(step, loss))
            """,
        ),
        Example(
            """
            import torch
            import torch_xla

            class ProgressMeter:
                def __init__(self, meters):
                    self.meters = meters

                def display(self, batch):
                    print('\\t'.join([str(batch)] + [str(m) for m in self.meters]))

            def train(model, loader, optimizer, losses, log_interval):
                progress = ProgressMeter([losses])
                for i, (x, y) in enumerate(loader):
                    loss = model(x, y)
                    losses.update(loss.detach(), x.size(0))
                    loss.backward()
                    optimizer.step()
                    if i % log_interval == 0:
                        progress.display(i + 1)
                    torch_xla.sync()
            """,
            """
            import torch
            import torch_xla
            import torch_xla.core.xla_model as xm

            class ProgressMeter:
                def __init__(self, meters):
                    self.meters = meters

                def display(self, batch):
                    print('\\t'.join([str(batch)] + [str(m) for m in self.meters]))

            def train(model, loader, optimizer, losses, log_interval):
                progress = ProgressMeter([losses])
                for i, (x, y) in enumerate(loader):
                    loss = model(x, y)
                    losses.update(loss.detach(), x.size(0))
                    loss.backward()
                    optimizer.step()
                    if i % log_interval == 0:
                        xm.add_step_closure(progress.display, args=(i + 1,))
                    torch_xla.sync()
            """,
            title="a method of the file's class that prints (pytorch/examples' ProgressMeter)",
        ),
        Example(
            """
            import torch

            def train(model, loader, optimizer):
                for step, (x, y) in enumerate(loader):
                    loss = model(x, y)
                    loss.backward()
                    optimizer.step()
                    print(step, loss.item())
            """,
            None,
            title="no step marker yet: reported (a full migrate adds one first, then wraps)",
        ),
    ]
    valid = [
        # no tensor value read (numpy's sum is not a tensor's)
        "import numpy as np\nimport torch\nimport torch_xla\nfor x, y in loader:\n    loss = f(x, y)\n    loss.backward()\n"
        "    print('step', i, loss.shape, np.sum(sizes))\n    torch_xla.sync()\n",
        # outside a training loop
        "import torch\nprint(loss.item())\n",
        # already in a step closure
        "import torch\nimport torch_xla.core.xla_model as xm\nfor x, y in loader:\n    loss = f(x, y)\n    loss.backward()\n"
        "    xm.add_step_closure(lambda loss: print(loss.item()), args=(loss,))\n",
        # a method of the file's class that does not print
        "import torch\nimport torch_xla\nclass P:\n    def tick(self, i):\n        self.i = i\n"
        "def train(loader):\n    p = P()\n    for x in loader:\n        loss = f(x)\n        loss.backward()\n        p.tick(1)\n"
        "        torch_xla.sync()\n",
        # a value, not a statement
        "import torch\nfor x, y in loader:\n    loss = f(x, y)\n    loss.backward()\n    line = print(loss.item()) or 1\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not is_logging_call(node, self.ctx):
            self._printing_method(node)
            return
        parent = self.ctx.parent
        if not isinstance(parent, cst.Expr):
            return
        loop = step_loop(self.ctx)
        if loop is None:
            return
        tensors = loop_tensors(self.ctx, loop)
        if not any(reads_tensor_value(a.value, self.ctx, tensors) for a in node.args):
            return
        message = (
            "this log line reads tensor values inside the step (a graph execution and a host "
            "transfer mid-step): run it after the step with xm.add_step_closure"
        )
        if not syncs_each_step(loop, self.ctx):
            self.report(node, f"{message} (not fixed yet: the loop has no step marker for the closure to "
                              "run at; add torch_xla.sync() (TX202) or iterate a pl.MpDeviceLoader (TX301))")
            return
        outer = outermost_loop(self.ctx) or loop
        varying = bound_names(outer)
        names = [n for n in free_reads(node) if n in varying]
        xm = self.ctx.module_alias("torch_xla.core.xla_model")
        line = self.ctx.ancestors[-3] if len(self.ctx.ancestors) >= 3 else None
        if (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
                and _needs_named_function(self.ctx.module, node, names)):
            fn_name = self._closure_name()

            def named(updated: cst.CSTNode) -> cst.CSTNode:
                call = updated.body[0].value  # type: ignore[attr-defined]
                return cst.FlattenSentinel(_named_closure(xm, fn_name, names, call, updated))

            self.report(node, message, Fix((self.replace(line, named),), imports=("torch_xla.core.xla_model",)))
            return

        def wrap(updated: cst.CSTNode) -> cst.CSTNode:
            return _closure(xm, names, updated)

        self.report(
            node,
            message,
            Fix((self.replace(node, wrap),), imports=("torch_xla.core.xla_model",)),
        )

    def _closure_name(self) -> str:
        """``log_step``, or ``log_step_2``... : a name the file does not use yet."""
        taken = self.__dict__.get("_taken")
        if taken is None:
            taken = {n.value for n in walk(self.ctx.module, into_functions=True) if isinstance(n, cst.Name)}
            self.__dict__["_taken"] = taken
        name, i = "log_step", 1
        while name in taken:
            i += 1
            name = f"log_step_{i}"
        taken.add(name)
        return name

    def _printing_method(self, node: cst.Call) -> None:
        """``progress.display(i + 1)``: a method of a class of the file whose body prints."""
        func = node.func
        if not (isinstance(func, cst.Attribute) and isinstance(self.ctx.parent, cst.Expr)):
            return
        loop = step_loop(self.ctx)  # cheap and cached: most calls are not in a step
        if loop is None:
            return
        cls = instance_class(self.ctx, func.value)
        fn = method(cls, func.attr.value) if cls is not None else None
        if fn is None or not prints(fn, self.ctx):
            return
        shown = f"{cls.name.value}.{func.attr.value}"
        message = (
            f"`{shown}` prints, inside the step: formatting the tensors it reads (meters kept on "
            "the device) executes the graph mid-step and copies to the host; run it after the step "
            "with xm.add_step_closure"
        )
        if not syncs_each_step(loop, self.ctx):
            self.report(node, f"{message} (not fixed yet: the loop has no step marker for the closure to "
                              "run at; add torch_xla.sync() (TX202) or iterate a pl.MpDeviceLoader (TX301))")
            return
        xm = self.ctx.module_alias("torch_xla.core.xla_model")
        if all(a.keyword is None and not a.star for a in node.args):
            def wrap(updated: cst.CSTNode) -> cst.CSTNode:
                assert isinstance(updated, cst.Call)
                return _method_closure(xm, updated)
        else:
            varying = bound_names(outermost_loop(self.ctx) or loop)
            names = [n for n in free_reads(node) if n in varying]

            def wrap(updated: cst.CSTNode) -> cst.CSTNode:
                return _closure(xm, names, updated)

        self.report(node, message, Fix((self.replace(node, wrap),), imports=("torch_xla.core.xla_model",)))


def _method_closure(xm: str, call: cst.Call) -> cst.Call:
    """``obj.method(a, b)`` -> ``xm.add_step_closure(obj.method, args=(a, b))``: the arguments
    are evaluated now, the method runs at the step marker."""
    args: list[cst.Arg] = [cst.Arg(call.func)]
    if call.args:
        elements = [cst.Element(a.value) for a in call.args]
        tup = cst.Tuple(elements if len(elements) > 1 else [cst.Element(elements[0].value, comma=cst.Comma())])
        args.append(cst.Arg(tup, keyword=cst.Name("args"), equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))))
    template = cst.parse_expression(f"{xm}.add_step_closure()")
    assert isinstance(template, cst.Call)
    return template.with_changes(args=args)


# a lambda stays readable up to this many parameters, on one line of this length
_LAMBDA_PARAMS = 2
_LAMBDA_WIDTH = 60


def _needs_named_function(module: cst.Module, call: cst.CSTNode, names: list[str]) -> bool:
    code = module.code_for_node(call)
    return len(names) > _LAMBDA_PARAMS or "\n" in code or len(code) > _LAMBDA_WIDTH


def _named_closure(xm: str, fn_name: str, names: list[str], call: cst.BaseExpression,
                   line: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
    """``print(...)`` -> ``def log_step(a, b):\n    print(...)`` and
    ``xm.add_step_closure(log_step, args=(a, b))``: the log line runs after the step with
    the values of this iteration."""
    params = cst.Parameters(params=[cst.Param(cst.Name(n)) for n in names])
    body = cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(call)])])
    fn = cst.FunctionDef(cst.Name(fn_name), params, body, leading_lines=line.leading_lines)
    args: list[cst.Arg] = [cst.Arg(cst.Name(fn_name))]
    if names:
        elements = [cst.Element(cst.Name(n)) for n in names]
        tup = cst.Tuple(elements if len(elements) > 1 else [cst.Element(elements[0].value, comma=cst.Comma())])
        args.append(cst.Arg(tup, keyword=cst.Name("args"), equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))))
    template = cst.parse_expression(f"{xm}.add_step_closure()")
    assert isinstance(template, cst.Call)
    register = line.with_changes(body=[cst.Expr(template.with_changes(args=args))], leading_lines=())
    return [fn, register]


def _closure(xm: str, names: list[str], call: cst.CSTNode) -> cst.Call:
    params = cst.Parameters(params=[cst.Param(cst.Name(n)) for n in names])
    fn = cst.Lambda(params=params, body=call)  # type: ignore[arg-type]
    if not names:
        fn = fn.with_changes(colon=cst.Colon(whitespace_after=cst.SimpleWhitespace(" ")))
    args: list[cst.Arg] = [cst.Arg(fn)]
    if names:
        tup = cst.Tuple([cst.Element(cst.Name(n)) for n in names])
        args.append(cst.Arg(tup, keyword=cst.Name("args"), equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))))
    template = cst.parse_expression(f"{xm}.add_step_closure()")
    assert isinstance(template, cst.Call)
    return template.with_changes(args=args)
