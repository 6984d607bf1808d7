import libcst as cst

from porter.rules import Example, Rule, Severity

from . import _ops_table as ops


class LossFunction(Rule):
    """
    ## What it does
    Rewrites torch's functional losses to optax / jax.numpy expressions with torch's
    semantics: `F.cross_entropy` (class axis 1, `reduction` mean/sum/none, `ignore_index`
    with torch's mean over the targets that are not ignored, `weight` with torch's weighted
    mean, `label_smoothing` as torch defines it, class-probability targets when the target
    is visibly a float tensor), `F.nll_loss`, `F.mse_loss`, `F.l1_loss`,
    `F.smooth_l1_loss` (Huber / beta), `F.huber_loss`, `F.binary_cross_entropy` (logs
    clamped at -100 as torch does), `F.binary_cross_entropy_with_logits` (`pos_weight`) and
    `F.kl_div` (`batchmean`). The deprecated `size_average=`/`reduce=` arguments become the
    reduction torch derives from them (they override `reduction=` in torch too); when they
    are not literal True/False they are reported.

    ## Why
    optax's losses are per-example and know nothing of torch's reductions, ignore_index or
    weights; a plain `optax.softmax_cross_entropy_with_integer_labels(...).mean()` differs
    from torch as soon as one of those is used.

    ## Fix safety
    Safe: every variant is compared with torch on random inputs (tests/test_jax_ops_run.py).
    One case is not masked: torch's default `ignore_index=-100` is only honoured when the
    call writes `ignore_index=`; a target of -100 then gives NaN in the port (an
    out-of-range label), never a silently different number.
    """

    code = "JX150"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "loss-function-to-optax"
    target = "jax"
    summary = "F.cross_entropy / F.mse_loss / ... -> optax / jnp with torch's reductions"
    severity = Severity.ERROR
    needs_text = ("loss", "cross_entropy", "kl_div")
    examples = [
        Example(
            """
            import torch.nn.functional as F

            def loss_fn(logits, y):
                return F.cross_entropy(logits, y)
            """,
            """
            import optax

            def loss_fn(logits, y):
                return optax.softmax_cross_entropy_with_integer_labels(logits, y, axis=1).mean()
            """,
            title="the common case",
        ),
        Example(
            """
            import torch.nn.functional as F

            def loss_fn(logits, y, pad):
                return F.cross_entropy(logits, y, ignore_index=pad, label_smoothing=0.1)
            """,
            """
            import jax
            import optax
            import jax.numpy as jnp

            def loss_fn(logits, y, pad):
                return jnp.sum((1 - 0.1) * ((y != pad) * optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(y != pad, y, 0), axis=1)) + 0.1 / logits.shape[1] * ((y != pad) * (-jnp.sum(jax.nn.log_softmax(logits, axis=1), axis=1)))) / jnp.sum(y != pad)
            """,
            title="ignore_index and label smoothing, exactly as torch",
        ),
        Example(
            """
            import torch.nn.functional as F

            def losses(p, x, y, t):
                return F.mse_loss(p, t, reduction="sum"), F.binary_cross_entropy_with_logits(x, y)
            """,
            """
            import optax

            def losses(p, x, y, t):
                return optax.squared_error(p, t).sum(), optax.sigmoid_binary_cross_entropy(x, y).mean()
            """,
            title="regression and binary losses",
        ),
        Example(
            """
            import torch.nn.functional as F

            def loss_fn(x, y, p, t):
                return F.mse_loss(x, y, size_average=False) + F.binary_cross_entropy(p, t, reduce=False).sum()
            """,
            """
            import optax
            import jax.numpy as jnp

            def loss_fn(x, y, p, t):
                return optax.squared_error(x, y).sum() + (-(t * jnp.maximum(jnp.log(p), -100.0) + (1 - t) * jnp.maximum(jnp.log(1 - p), -100.0))).sum()
            """,
            title="the deprecated size_average= / reduce= as torch reads them",
        ),
        Example(
            """
            import torch.nn.functional as F

            def loss_fn(x, y, average):
                return F.mse_loss(x, y, size_average=average)
            """,
            """
            import torch.nn.functional as F

            def loss_fn(x, y, average):
                return F.mse_loss(x, y, size_average=average)  # porter: manual
            """,
            title="deprecated arguments that are not literal: reported",
        ),
    ]
    valid = ["import optax\nloss = optax.softmax_cross_entropy_with_integer_labels(x, y).mean()\n"]

    def visit_Call(self, node: cst.Call) -> None:
        q = self.ctx.qualname(node.func)
        o = ops.LOSS_FUNCTIONS.get(q) if q else None
        if o is None:
            return
        ops.port_call(self, node, o, None)
