from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

from . import _nnx
from . import _ops_table as ops

_AT = {cst.AddAssign: "add", cst.SubtractAssign: "subtract", cst.MultiplyAssign: "multiply",
       cst.DivideAssign: "divide", cst.PowerAssign: "power"}


class ItemAssignment(Rule):
    """
    ## What it does
    Rewrites item assignment to a tensor in a module's methods, to an argument of a jitted
    function (a train step's label), or to a JAX array in host code (`losses = jnp.zeros(n)`
    then `losses[k] = loss.item()` in an evaluation loop; what a jitted step returns), into JAX's
    functional update of a plain local name: `x[idx] = v` -> `x = x.at[idx].set(v)`, `x[idx] += v` ->
    `x = x.at[idx].add(v)` (`-=`, `*=`, `/=`, `**=`: `subtract`, `multiply`, `divide`,
    `power`); a mask made by a comparison (`logits[logits < v] = -float('inf')`, a boolean
    index whose true count is data-dependent) -> `logits = jnp.where(logits < v, -float('inf'),
    logits)`, which keeps a static shape under jit. Item assignment to anything else (an
    attribute, `self.buf[i] = v`, a name the rules cannot show is a tensor) is reported.

    ## Why
    JAX arrays are immutable: `x[idx] = v` raises "JAX arrays are immutable" at the first
    call of the ported module.

    ## Fix safety
    Safe for a plain local name, as JX104's in-place methods: the name is rebound to the value
    torch wrote; other names sharing the tensor's storage (a view) would not see it, which
    JAX arrays never do.
    """

    code = "JX109"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-item-assignment"
    target = "jax"
    summary = "x[idx] = v / x[idx] += v on a JAX array -> x = x.at[idx].set(v) / .add(v); a comparison mask -> jnp.where"
    severity = Severity.ERROR
    needs_text = ("] =", "] +=", "] -=", "] *=", "] /=")
    examples = [
        Example(
            """
            import torch
            import torch.nn as nn

            class Head(nn.Module):
                def forward(self, x, v):
                    y = x * 2
                    y[:, 0] = 0.0
                    y[..., 1:] += v
                    y[y < 0.5] = -float('inf')
                    return y
            """,
            """
            import torch
            import torch.nn as nn
            import jax.numpy as jnp

            class Head(nn.Module):
                def forward(self, x, v):
                    y = x * 2
                    y = y.at[:, 0].set(0.0)
                    y = y.at[..., 1:].add(v)
                    y = jnp.where(y < 0.5, -float('inf'), y)
                    return y
            """,
        ),
        Example(
            """
            import jax.numpy as jnp

            def estimate_loss(model, batches, n):
                losses = jnp.zeros(n)
                for k in range(n):
                    losses[k] = model(*batches[k])
                return losses.mean()


            totals = jnp.zeros((2, 3))
            totals[0, :] += 1.0
            """,
            """
            import jax.numpy as jnp

            def estimate_loss(model, batches, n):
                losses = jnp.zeros(n)
                for k in range(n):
                    losses = losses.at[k].set(model(*batches[k]))
                return losses.mean()


            totals = jnp.zeros((2, 3))
            totals = totals.at[0, :].add(1.0)
            """,
            title="a JAX array filled item by item in host code (an evaluation loop, the module level)",
        ),
        Example(
            """
            import flax.nnx as nnx
            import jax.numpy as jnp

            @nnx.jit
            def train_step(model, optimizer, x, label):
                def loss_fn(model, label):
                    label[:] = 0.0
                    return ((model(x) - label) ** 2).mean(), label
                (loss, label), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, label)
                optimizer.update(model, grads)
                return loss, label

            label = jnp.ones(8)
            for x in batches:
                loss, label = train_step(model, optimizer, x, label)
                label[:] = 1.0
            """,
            """
            import flax.nnx as nnx
            import jax.numpy as jnp

            @nnx.jit
            def train_step(model, optimizer, x, label):
                def loss_fn(model, label):
                    label = label.at[:].set(0.0)
                    return ((model(x) - label) ** 2).mean(), label
                (loss, label), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, label)
                optimizer.update(model, grads)
                return loss, label

            label = jnp.ones(8)
            for x in batches:
                loss, label = train_step(model, optimizer, x, label)
                label = label.at[:].set(1.0)
            """,
            title="an argument of a jitted step (traced) and what the step returns (a GAN's label relabelled between passes)",
        ),
    ]
    valid = [
        "import torch\nd = {}\nd['a'] = 1\n",
        "import torch\ndef collate(n):\n    buf = torch.zeros(n)\n    buf[0] = 1.0\n    return buf\n",
        "import torch.nn as nn\nclass M(nn.Module):\n    def forward(self, x):\n        cache = {}\n        cache[0] = x\n        return x\n",
    ]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) != 1:
            return
        in_module = _nnx.module_method(self.ctx) is not None
        small = node.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target, value, op = small.targets[0].target, small.value, None
        elif isinstance(small, cst.AugAssign) and type(small.operator) in _AT:
            target, value, op = small.target, small.value, _AT[type(small.operator)]
        else:
            return
        if not isinstance(target, cst.Subscript) or not isinstance(target.value, cst.Name):
            return
        name = target.value.value
        if name not in ops.tensor_names(self.ctx):
            return
        if not in_module and not self._jax_array(name):
            return  # host code: a torch tensor the port keeps (the input pipeline) takes item assignment
        index = target.slice
        jnp = self.ctx.module_alias("jax.numpy")
        rhs = astutil.code(value)
        mask = index[0].slice.value if len(index) == 1 and isinstance(index[0].slice, cst.Index) else None
        if op is None and isinstance(mask, (cst.Comparison, cst.UnaryOperation)) and \
                (not isinstance(mask, cst.UnaryOperation) or isinstance(mask.operator, cst.BitInvert)):
            text = f"{name} = {jnp}.where({astutil.code(mask)}, {rhs}, {name})"
            imports: tuple = ("jax.numpy",)
        else:
            at = astutil.code(target.with_changes(value=cst.Attribute(cst.Name(name), cst.Name("at"))))
            text = f"{name} = {at}.{op or 'set'}({rhs})"
            imports = ()
        self.report(node, f"item assignment to {name}: JAX arrays are immutable; a functional update of {name}",
                    Fix((self.replace(node, node.with_changes(body=[cst.parse_statement(text).body[0]])),), imports=imports))

    def _jax_array(self, name: str) -> bool:
        """Outside module code: ``name`` is a parameter of a jitted function (or of a function
        defined in one: a train step's loss_fn), where every argument is traced, or every
        binding the function (or the module level) gives it is made by JAX: a call of JAX
        (``losses = jnp.zeros(n)``, once JX101 has ported ``torch.zeros``) or an unpacking of
        what a jitted function of the file returns (``loss, label = train_step(...)``); an
        augmented assignment (``x += 1``) keeps what it was."""
        fns = [a for a in self.ctx.ancestors if isinstance(a, cst.FunctionDef)]
        for i, fn in enumerate(fns):
            if any(self._jit(d.decorator) for d in fn.decorators):
                if any(name in {p.name.value for p in astutil.params(f.params)} for f in fns[i:]):
                    return True
        scope = fns[-1].body if fns else self.ctx.module
        jitted = {d.name.value for d in self.ctx.module.body
                  if isinstance(d, cst.FunctionDef) and any(self._jit(x.decorator) for x in d.decorators)}
        found = False
        for node in astutil.walk(scope):
            targets = ([t.target for t in node.targets] if isinstance(node, cst.Assign)
                       else [node.target] if isinstance(node, (cst.AnnAssign, cst.For)) else [])
            for target in targets:
                if name not in astutil.target_names(target):
                    continue
                value = getattr(node, "value", None)
                if isinstance(target, cst.Name) and isinstance(node, (cst.Assign, cst.AnnAssign)):
                    ok = isinstance(value, cst.Call) and (self.ctx.qualname(value.func) or "").startswith("jax.")
                else:
                    ok = (isinstance(node, cst.Assign) and isinstance(value, cst.Call)
                          and isinstance(value.func, cst.Name) and value.func.value in jitted)
                if not ok:
                    return False
                found = True
        return found

    def _jit(self, decorator: cst.BaseExpression) -> bool:
        func = decorator.func if isinstance(decorator, cst.Call) else decorator
        return (self.ctx.qualname(func) or "") in ("jax.jit", "flax.nnx.jit")
