from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Safety, Severity

from . import _loop as lp


class TensorGrad(Rule):
    """
    ## What it does
    The gradient of a scalar with respect to plain tensors, taken with `y.backward()` and
    read as `x.grad` (autograd on tensors made with `requires_grad=True`, no model and no
    optimizer), becomes `jax.value_and_grad` of a function of those tensors:

        x = torch.tensor(1., requires_grad=True)      x = jnp.asarray(1.)
        w = torch.tensor(2., requires_grad=True)      w = jnp.asarray(2.)
        y = w * x + 3                                 def y_of(x, w):
        y.backward()                                      y = w * x + 3
        print(x.grad, w.grad)                             return y
                                                      y, (x_grad, w_grad) = jax.value_and_grad(y_of, argnums=(0, 1))(x, w)
                                                      print(x_grad, w_grad)

    The tensors differentiated are the names whose `.grad` the block reads after the
    backward call (up to the next backward call, or a statement that rebinds one of
    them); the function's body is the chain of assignments of the same block that computes
    the scalar from them (the statements stay where they are: the function computes them
    again, from the same arrays). The value keeps its name; each `x.grad` read becomes the
    array `x_grad`.

    Not rewritten, and reported at the backward call: a `.grad` read of something other
    than a plain name (a layer's `weight.grad`: JX301's training step), a `.grad` written or
    zeroed in place, a backward call with arguments, a chain that runs through a statement
    other than a plain assignment (a loop, an in-place update), or one that calls a model.

    ## Why
    JAX arrays have no `.grad` field and no `backward()`: a gradient is the value of a
    function (`jax.grad` / `jax.value_and_grad`) of the arrays it is taken with respect to.

    ## Fix safety
    Safe: the function is the same arithmetic on the same arrays, and `backward()` without
    arguments (a scalar) gives the gradient `jax.value_and_grad` returns; a tensor's first
    `.grad` after one backward call is that gradient.
    """

    code = "JX313"
    name = "jax-tensor-grad"
    target = "jax"
    summary = "y.backward(); x.grad on requires_grad tensors -> jax.value_and_grad of a function of them"
    severity = Severity.ERROR
    needs_text = (".backward(",)
    examples = [
        Example(
            """
            import torch

            x = torch.tensor(1., requires_grad=True)
            w = torch.tensor(2., requires_grad=True)
            b = torch.tensor(3., requires_grad=True)
            y = w * x + b
            y.backward()
            print(x.grad)
            print(w.grad, b.grad)
            """,
            """
            import torch
            import jax

            x = torch.tensor(1., requires_grad=True)
            w = torch.tensor(2., requires_grad=True)
            b = torch.tensor(3., requires_grad=True)
            y = w * x + b
            def y_of(x, w, b):
                y = w * x + b
                return y
            y, (x_grad, w_grad, b_grad) = jax.value_and_grad(y_of, argnums=(0, 1, 2))(x, w, b)
            print(x_grad)
            print(w_grad, b_grad)
            """,
            title="scalars made with requires_grad=True",
        ),
        Example(
            """
            import torch

            def demo():
                a = torch.randn(3, requires_grad=True)
                h = a.sin() * 2
                total = (h ** 2).sum()
                total.backward()
                g = a.grad
                return g, h
            """,
            """
            import torch
            import jax

            def demo():
                a = torch.randn(3, requires_grad=True)
                h = a.sin() * 2
                total = (h ** 2).sum()
                def total_of(a):
                    h = a.sin() * 2
                    total = (h ** 2).sum()
                    return total
                total, (a_grad,) = jax.value_and_grad(total_of, argnums=(0,))(a)
                g = a_grad
                return g, h
            """,
            title="a chain of statements in a function, one tensor",
        ),
        Example(
            """
            import torch

            x = torch.ones(2, requires_grad=True)
            for _ in range(3):
                x = x * 2
            out = x.sum()
            out.backward()
            print(x.grad)
            """,
            None,
            title="a chain through a loop: reported",
        ),
    ]
    valid = [
        "import torch\ndef f(loss):\n    loss.backward()\n",
        "import torch\nx = torch.ones(2, requires_grad=True)\ny = model(x).sum()\ny.backward()\nprint(model.fc.weight.grad)\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        self._block(node.body)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._block(node.body)

    def _block(self, stmts: Sequence[cst.BaseStatement]) -> None:
        if not lp.imports_torch(self.ctx):
            return
        for i, stmt in enumerate(stmts):
            target = _backward_of(stmt)
            if target is None:
                continue
            try:
                self._rewrite(stmts, i, target)
            except lp.Unsupported as exc:
                self.report(stmt, f"`{lp.code(stmt).strip()}`: the gradient is not rewritten: {exc}")

    def _rewrite(self, stmts: Sequence[cst.BaseStatement], i: int, backward: cst.Call) -> None:
        receiver = backward.func.value  # type: ignore[attr-defined]
        if not isinstance(receiver, cst.Name):
            return  # `model(x).sum().backward()`: not this rule's shape
        value = receiver.value
        # the .grad reads after the call, up to the next backward or a rebinding of a read name
        reads: list[cst.Attribute] = []
        leaves: dict[str, None] = {}
        assigned = {n for prev in stmts[:i] if _plain_assignment(prev) for n in lp.binds(prev)}
        for later in stmts[i + 1:]:
            if _backward_of(later) is not None or lp.has_backward(later):
                break
            grads = [n for n in astutil.walk(later, into_functions=True)
                     if isinstance(n, cst.Attribute) and n.attr.value == "grad"]
            for g in grads:
                if not isinstance(g.value, cst.Name) or g.value.value not in assigned:
                    # a layer's weight.grad (the training step's, JX301), a loop's `p.grad`
                    # over model.parameters(): not plain tensors of this block
                    return
            if _writes_grad(later):
                raise lp.Unsupported(f"`{lp.code(later).strip()}` writes a .grad")
            for g in grads:
                leaves[g.value.value] = None  # type: ignore[attr-defined]
                reads.append(g)
            if lp.binds(later) & set(leaves):
                break
        if not leaves:
            return
        if backward.args:
            raise lp.Unsupported("backward() with arguments (the gradient of a non-scalar, or retain_graph=)")
        facts = lp.file_facts(self.ctx)
        # the assignments that compute the value, walking back from the call to the tensors'
        # own assignments (what comes before all of them cannot depend on them)
        needed = {value}
        chain: list[cst.BaseStatement] = []
        found: set[str] = set()
        for prev in reversed(stmts[:i]):
            if found >= set(leaves):
                break
            bound = _binds_within(prev)
            hit = bound & needed
            if not hit:
                continue
            if hit & set(leaves):
                if hit - set(leaves) or not _plain_assignment(prev):
                    raise lp.Unsupported(f"`{lp.code(prev).strip().splitlines()[0]}` rebinds "
                                         f"{', '.join(sorted(hit & set(leaves)))} on the way to the value")
                found |= hit  # the tensor's own assignment: an argument of the function
                needed -= hit
                continue
            if not _plain_assignment(prev):
                raise lp.Unsupported(f"`{lp.code(prev).strip().splitlines()[0]}` computes {', '.join(sorted(hit))} "
                                     "and is not a plain assignment")
            chain.insert(0, prev)
            needed = (needed - bound) | (set(lp.reads(prev)) - found)
        missing = [n for n in leaves if n not in found]
        if missing:
            raise lp.Unsupported(f"{', '.join(missing)} is not assigned in this block before the value")
        # of those, the ones the tensors flow into; the others are values the function reads
        flows = set(leaves)
        kept = []
        for s in chain:
            if set(lp.reads(s)) & flows:
                kept.append(s)
                flows |= lp.binds(s)
        chain = kept
        if value not in flows:
            raise lp.Unsupported(f"{value} does not depend on {', '.join(leaves)} in this block")
        for s in chain:
            called = {n for n in lp.reads(s) if n in facts.modules}
            if called:
                raise lp.Unsupported(f"`{lp.code(s).strip()}` calls the model {', '.join(sorted(called))}")
        taken = set(lp.reads(self.ctx.module)) | facts.toplevel
        fn = _fresh(f"{value}_of", taken)
        grads = {n: _fresh(f"{n}_grad", taken | {fn}) for n in leaves}
        params = list(leaves)
        body = "\n".join("    " + line for s in chain for line in lp.code(s.with_changes(leading_lines=[])).strip("\n").splitlines())
        names = ", ".join(grads[n] for n in params) + ("," if len(params) == 1 else "")
        argnums = ", ".join(str(k) for k in range(len(params))) + ("," if len(params) == 1 else "")
        text = (f"def {fn}({', '.join(params)}):\n{body}\n    return {value}\n"
                f"{value}, ({names}) = jax.value_and_grad({fn}, argnums=({argnums}))({', '.join(params)})\n")
        new = list(cst.parse_module(text).body)
        stmt = stmts[i]
        new[0] = new[0].with_changes(leading_lines=stmt.leading_lines)
        edits = [self.replace(stmt, cst.FlattenSentinel(new))]
        for g in reads:
            edits.append(self.replace(g, cst.Name(grads[g.value.value])))  # type: ignore[attr-defined]
        self.report(stmt, f"`{lp.code(stmt).strip()}` and the .grad reads of {', '.join(params)}: "
                          f"rewrite as jax.value_and_grad({fn}, ...)", Fix(tuple(edits), Safety.SAFE, ("jax",)))


def _backward_of(stmt: cst.BaseStatement) -> Optional[cst.Call]:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Expr):
        call = stmt.body[0].value
        if isinstance(call, cst.Call) and astutil.method_name(call) == "backward":
            return call
    return None


def _binds_within(stmt: cst.BaseStatement) -> set[str]:
    """What the statement binds or mutates, in its nested blocks too (a loop's body)."""
    out = set(lp.binds(stmt))
    for n in astutil.walk(stmt, into_functions=False):
        if isinstance(n, cst.BaseStatement) and n is not stmt:
            out |= lp.binds(n)
    return out


def _plain_assignment(stmt: cst.BaseStatement) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Assign)
            and all(isinstance(t.target, (cst.Name, cst.Tuple)) for t in stmt.body[0].targets))


def _writes_grad(stmt: cst.BaseStatement) -> bool:
    for n in astutil.walk(stmt, into_functions=True):
        if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in n.targets] if isinstance(n, cst.Assign) else [n.target]
            if any("grad" in lp.code(t).split(".")[-1:] for t in targets):
                return True
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and isinstance(n.func.value, cst.Attribute) \
                and n.func.value.attr.value == "grad" and n.func.attr.value.endswith("_"):
            return True
    return False


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 2
    while name in taken:
        name, k = f"{base}{k}", k + 1
    return name
