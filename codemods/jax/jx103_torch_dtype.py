import libcst as cst

from porter.rules import Example, Fix, Rule, Severity

from . import _ops_table as ops


class TorchDtype(Rule):
    """
    ## What it does
    Rewrites torch dtypes (`torch.float32`, `torch.long`, `torch.bool`, ...) to JAX dtypes
    (`jnp.float32`, `jnp.int32`, `jnp.bool_`, ...) wherever they are used as values:
    comparisons (`x.dtype == torch.float16`), variables, arguments of calls porter ports.
    A dtype passed to a call that stays torch (`model.to(torch.bfloat16)`,
    `torch.set_default_dtype(...)`, a call marked for a manual port) is left alone.

    ## Why
    torch dtypes are torch objects; jax.numpy functions and `astype` want numpy/JAX dtypes.

    ## Fix safety
    Safe, with one documented difference: JAX runs with 64-bit types disabled by default, so
    `torch.int64`/`torch.long` (torch's default integer type) becomes `jnp.int32`, what JAX
    stores anyway; `torch.float64` stays `jnp.float64` (JAX stores float32 and warns unless
    `jax_enable_x64` is set).
    """

    code = "JX103"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "torch-dtype-to-jax"
    target = "jax"
    summary = "torch.float32 / torch.long / ... -> jnp.float32 / jnp.int32 / ..."
    severity = Severity.ERROR
    needs_text = ("torch",)
    examples = [
        Example(
            """
            import torch

            def cast(x: torch.Tensor, half):
                dt = torch.float16 if half else torch.float32
                return x.to(dt), x.dtype == torch.long
            """,
            """
            import torch
            import jax.numpy as jnp

            def cast(x: torch.Tensor, half):
                dt = jnp.float16 if half else jnp.float32
                return x.to(dt), x.dtype == jnp.int32
            """,
            title="dtypes used as values",
        ),
    ]
    valid = [
        "import torch\nmodel = model.to(torch.bfloat16)\n",
        "import torch\ntorch.set_default_dtype(torch.float64)\n",
        "import jax.numpy as jnp\nx = jnp.zeros(3, jnp.float32)\n",
    ]

    def visit_Attribute(self, node: cst.Attribute) -> None:
        name = ops.torch_dtype_name(node, self.ctx)
        if name is None or ops.in_data_pipeline(self.ctx):
            return
        if self._in_unported_call():
            return
        jnp = self.ctx.module_alias("jax.numpy")
        new = cst.parse_expression(f"{jnp}.{ops.DTYPES[name]}")
        self.report(node, f"torch.{name} -> {jnp}.{ops.DTYPES[name]}", Fix((self.replace(node, new),), imports=("jax.numpy",)))

    def _in_unported_call(self) -> bool:
        """The dtype is an argument of a call that stays torch (or is not a tensor call)."""
        anc = self.ctx.ancestors
        for i in range(len(anc) - 2, 0, -1):
            node = anc[i]
            if isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.Lambda)):
                return False
            if isinstance(node, cst.Arg) and isinstance(anc[i - 1], cst.Call):
                call = anc[i - 1]
                if ops.function_op(call, self.ctx) is not None:
                    o = ops.function_op(call, self.ctx)
                    return bool(o.manual) or self._manual(o, call, None)
                if isinstance(call.func, cst.Attribute) and ops.METHODS.get(call.func.attr.value) is not None:
                    o = ops.method_op(call, self.ctx)
                    return o is None or self._manual(o, call, call.func.value)
                return (self.ctx.qualname(call.func) or "").startswith("torch.")
        return False

    def _manual(self, o, call, receiver) -> bool:
        try:
            ops.build(o, call, self.ctx, receiver)
        except (ops.Manual, ops.NotMine):
            return True
        return False
