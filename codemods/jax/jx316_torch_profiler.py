from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp

_PROFILE = ("torch.profiler.profile",)
_HANDLER = ("torch.profiler.tensorboard_trace_handler",)
_RECORD = ("torch.profiler.record_function", "torch.autograd.profiler.record_function")
# options of torch.profiler.profile that choose what torch records; jax.profiler.trace records
# the host and the device always (XLA's own events: no shapes, memory, stacks or FLOP counts)
_OPTIONS = frozenset({"activities", "schedule", "on_trace_ready", "record_shapes", "profile_memory", "with_stack",
                      "with_flops", "with_modules", "acc_events", "use_cuda"})


class TorchProfiler(Rule):
    """
    ## What it does
    Ports torch's profiler to JAX's:

    - `with torch.profiler.profile(..., on_trace_ready=torch.profiler.tensorboard_trace_handler(d)) as prof:`
      becomes `with jax.profiler.trace(d):` (a TensorBoard profile under `d`, as torch's
      handler writes one);
    - `prof.step()` at the end of a `for k in ...:` loop body becomes the loop body wrapped in
      `with jax.profiler.StepTraceAnnotation("train", step_num=k):` (the steps marked in the
      trace, as torch's step marks them), and elsewhere it goes. A training loop in the block
      is rewritten into its jitted step (JX301) first;
    - `with torch.profiler.record_function(name):` becomes `with jax.profiler.TraceAnnotation(name):`.

    A profiler whose results are read in the script (`prof.key_averages()`,
    `prof.export_chrome_trace(...)`, no `on_trace_ready=`), whose handler is the script's own
    function, or that is given an option torch's `profile` has and JAX's trace does not say
    anything about, is reported: there is nothing in `jax.profiler` to read them from.

    ## Why
    A JAX port has no torch work to profile: torch's profiler records nothing of the jitted
    step (its CUDA activity asks for a CUDA device). JAX's profiler records XLA's host and
    device events, for TensorBoard's profile plugin or Perfetto.

    ## Fix safety
    Safe for a profiler without `schedule=`: it traces the whole block, as torch's does, into
    the same directory. Unsafe with `schedule=` (wait / warmup / active steps): JAX's trace
    records every step of the block, so the trace is longer than torch's window and the
    profiler's overhead covers every step. `record_function` to `TraceAnnotation` is safe.
    """

    code = "JX316"
    name = "jax-torch-profiler"
    target = "jax"
    summary = "torch.profiler.profile / prof.step() / record_function -> jax.profiler.trace / StepTraceAnnotation / TraceAnnotation"
    severity = Severity.WARNING
    needs_text = ("profiler",)
    examples = [
        Example(
            """
            import torch

            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                on_trace_ready=torch.profiler.tensorboard_trace_handler('./log'),
                record_shapes=True,
            ) as prof:
                for step in range(10):
                    with torch.profiler.record_function("forward"):
                        loss = train_step(model, batch)
                    prof.step()
            """,
            """
            import jax

            with jax.profiler.trace('./log'):
                for step in range(10):
                    with jax.profiler.StepTraceAnnotation("train", step_num=step):
                        with jax.profiler.TraceAnnotation("forward"):
                            loss = train_step(model, batch)
            """,
            title="a trace for TensorBoard, its steps marked",
        ),
        Example(
            """
            from torch.profiler import profile, schedule, tensorboard_trace_handler

            with profile(schedule=schedule(wait=1, warmup=1, active=3),
                         on_trace_ready=tensorboard_trace_handler(log_dir)) as p:
                batch = next(it)
                while batch is not None:
                    batch = run(batch)
                    p.step()
            """,
            """
            import jax

            with jax.profiler.trace(log_dir):
                batch = next(it)
                while batch is not None:
                    batch = run(batch)
            """,
            unsafe=True,
            title="a schedule: JAX traces every step",
        ),
        Example(
            """
            import torch

            with torch.profiler.profile() as prof:
                run(model)
            print(prof.key_averages().table())
            """,
            None,
            title="results read in the script",
        ),
    ]
    valid = [
        "import jax\nwith jax.profiler.trace('/tmp/t'):\n    run()\n",
        "import cProfile\nwith cProfile.Profile() as prof:\n    run()\n",
    ]

    def visit_With(self, node: cst.With) -> None:
        items = [i for i in node.items if isinstance(i.item, cst.Call) and self.ctx.qualname(i.item.func) in _PROFILE]
        if not items:
            return
        item = items[0]
        call = item.item
        assert isinstance(call, cst.Call)
        blocker = self._blocker(node, item, call)
        if isinstance(blocker, str):
            self.report(call, f"torch.profiler.profile(...): {blocker}: JAX's profiler writes a trace for TensorBoard "
                              "or Perfetto (jax.profiler.trace(log_dir)) and has no results to read in the script; "
                              "port the profiling by hand")
            return
        log_dir, name = blocker
        if any(isinstance(n, cst.For) and lp.has_backward(n.body) for n in astutil.walk(node.body)):
            # JX301 rewrites the training loop first (the step marks then wrap the jitted step's
            # call); a loop it marked for a human waits too: the mark may be of a pass before
            # another rule removed what stopped it (`with ctx:`), and a body wrapped in a step
            # mark would stop it for good
            return
        unsafe = astutil.arg(call, "schedule") is not None
        trace = cst.WithItem(astutil.parse_expression(f"jax.profiler.trace({astutil.code(log_dir)})"),
                             comma=item.comma)
        body = node.body.visit(_StepMarks(name))
        new = node.with_changes(items=[trace if i is item else i for i in node.items], body=body)
        note = (": JAX traces every step of the block, not only the schedule's active window" if unsafe else "")
        self.report(call, "torch.profiler.profile -> jax.profiler.trace(log_dir) (a TensorBoard profile of the JAX "
                          f"port; prof.step() -> jax.profiler.StepTraceAnnotation){note}",
                    Fix((self.replace(node, new),), Safety.UNSAFE if unsafe else Safety.SAFE, imports=("jax",)))

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) not in _RECORD:
            return
        item = self.ctx.parent
        if not isinstance(item, cst.WithItem) or item.item is not node or item.asname is not None:
            return  # a decorator, or the record kept in a name: JX901 reports it
        if len(node.args) != 1 or node.args[0].keyword not in (None,) and node.args[0].keyword.value != "name" \
                or node.args[0].star:
            return
        name = astutil.code(node.args[0].value)
        self.report(node, f"{astutil.code(node.func)}: the JAX port's work is XLA's: "
                          f"jax.profiler.TraceAnnotation({name}) names the region in JAX's trace",
                    Fix((self.replace(node, astutil.parse_expression(f"jax.profiler.TraceAnnotation({name})")),),
                        imports=("jax",)))

    def _blocker(self, node: cst.With, item: cst.WithItem, call: cst.Call):
        """(the trace directory, the `as` name or None), or why the profiler cannot map."""
        if any(a.star for a in call.args) or any(a.keyword is None for a in call.args):
            return "arguments porter does not read"
        unknown = [a.keyword.value for a in call.args if a.keyword is not None and a.keyword.value not in _OPTIONS]
        if unknown:
            return f"{unknown[0]}= has no JAX counterpart"
        ready = astutil.arg(call, "on_trace_ready")
        if ready is None:
            return "no on_trace_ready=: the results stay in the profiler object"
        handler = ready.value
        if not (isinstance(handler, cst.Call) and self.ctx.qualname(handler.func) in _HANDLER and handler.args
                and handler.args[0].keyword is None and not handler.args[0].star):
            return f"on_trace_ready={astutil.code(handler)} is a handler porter cannot map"
        name: Optional[str] = None
        if item.asname is not None:
            if not isinstance(item.asname.name, cst.Name):
                return "an `as` target porter does not follow"
            name = item.asname.name.value
            for n, parent, grand in _name_uses(self.ctx.module, name):
                if not (isinstance(parent, cst.Attribute) and parent.value is n and parent.attr.value == "step"
                        and isinstance(grand, cst.Call) and not grand.args and _inside(node, grand)):
                    return f"`{name}` is read otherwise than `{name}.step()` in the block"
        return handler.args[0].value, name


def _inside(outer: cst.CSTNode, inner: cst.CSTNode) -> bool:
    return any(n is inner for n in astutil.walk(outer, into_functions=True))


def _name_uses(module: cst.Module, name: str):
    """Every read of ``name`` in the module: (the Name, its parent, its grandparent)."""
    found = []

    def visit(node: cst.CSTNode, parent, grand) -> None:
        if isinstance(node, cst.Name) and node.value == name:
            if not (isinstance(parent, cst.AsName) or (isinstance(parent, cst.Attribute) and parent.attr is node)):
                found.append((node, parent, grand))
        for child in astutil.children(node):
            visit(child, node, parent)

    visit(module, None, None)
    return found


class _StepMarks(cst.CSTTransformer):
    """``prof.step()`` as the last statement of a ``for`` loop body -> the body under
    ``jax.profiler.StepTraceAnnotation``; elsewhere removed."""

    def __init__(self, name: Optional[str]) -> None:
        super().__init__()
        self.name = name

    def _is_step(self, stmt: cst.CSTNode) -> bool:
        if self.name is None or not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return False
        expr = stmt.body[0]
        return (isinstance(expr, cst.Expr) and isinstance(expr.value, cst.Call) and not expr.value.args
                and isinstance(expr.value.func, cst.Attribute) and expr.value.func.attr.value == "step"
                and isinstance(expr.value.func.value, cst.Name) and expr.value.func.value.value == self.name)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def leave_For(self, original: cst.For, updated: cst.For):
        body = updated.body
        before = original.body
        if not isinstance(body, cst.IndentedBlock) or not isinstance(before, cst.IndentedBlock) \
                or not isinstance(updated.target, cst.Name) or len(before.body) < 2 or not body.body:
            return updated
        if not self._is_step(before.body[-1]):
            return updated
        k = updated.target.value
        inner = cst.IndentedBlock(body=list(body.body))  # the step already removed below
        mark = cst.With(items=[cst.WithItem(astutil.parse_expression(
            f'jax.profiler.StepTraceAnnotation("train", step_num={k})'))], body=inner)
        return updated.with_changes(body=body.with_changes(body=[mark]))

    def leave_SimpleStatementLine(self, original, updated):
        if self._is_step(updated):
            return cst.RemoveFromParent()
        return updated
