import libcst as cst

from porter.rules import Example, Fix, Rule, Safety, Severity

from ._tables import in_availability_choice


class CudaIsAvailable(Rule):
    """
    ## What it does
    Handles `torch.cuda.is_available()` outside the device-selection idiom TX101 rewrites.
    Where it is one operand of an `and` with a user's choice
    (`use_cuda = not args.no_cuda and torch.cuda.is_available()`) the unsafe fix drops it,
    keeping the user's choice (`use_cuda = not args.no_cuda`). A test on availability alone
    (`if torch.cuda.is_available(): A else: B`, `x if torch.cuda.is_available() else y`, and
    their `not` forms) gets an unsafe fix that keeps the CUDA branch, A: the port's accelerator
    is the XLA device, and the rules for what is inside (`.cuda()` -> TX102, ...) port that
    branch. Anywhere else (an `elif` chain, an `or`, a stored flag) it is reported.

    ## Why
    On a TPU host `torch.cuda.is_available()` is False, so code guarded by it silently runs on
    the CPU. torch_xla has no "is an accelerator present" call that keeps the semantics: after
    `import torch_xla` a PJRT device is always selected (TPU, NEURON, else CPU; measured with
    `PJRT_DEVICE` unset: `xr.device_type()` is `'CPU'`), so the XLA device always exists.
    `torch_xla.device_count()` answers at least 1 and initializes the runtime (measured), which
    breaks a later `torch_xla.launch`. If the program must know whether a real accelerator is
    there, `xr.device_type() != 'CPU'` tells (it reads the selected PJRT device without
    initializing the runtime).

    ## Fix safety
    Unsafe: dropping the test makes the program use the XLA device wherever the user did not
    opt out, also on a host without TPU (where it is XLA on the CPU, not eager CPU), and drops
    the CPU branch of an availability test. That is the port's intent, but it changes what that
    host runs.
    """

    code = "TX107"
    name = "cuda-is-available"
    target = "torch-xla"
    summary = "torch.cuda.is_available() is False on TPU: unsafe fixes keep the CUDA branch / the user's flag, else report"
    severity = Severity.ERROR
    needs_text = ("is_available",)
    examples = [
        Example(
            """
            import torch

            use_cuda = not args.no_cuda and torch.cuda.is_available()
            device = torch.device("cuda" if use_cuda else "cpu")
            """,
            """
            import torch

            use_cuda = not args.no_cuda
            device = torch.device("cuda" if use_cuda else "cpu")
            """,
            unsafe=True,
        ),
        Example(
            """
            import torch

            def step(images, target, gpu):
                # move the batch
                if torch.cuda.is_available():
                    target = target.cuda(gpu, non_blocking=True)
                if not torch.cuda.is_available():
                    print("using CPU, this will be slow")
                else:
                    print("GPU")
                gpu = gpu if torch.cuda.is_available() else None
                if not torch.cuda.is_available():
                    warn()
                return target
            """,
            """
            import torch

            def step(images, target, gpu):
                # move the batch
                target = target.cuda(gpu, non_blocking=True)
                print("GPU")
                gpu = gpu
                return target
            """,
            unsafe=True,
            title="the unsafe fix keeps the CUDA branch of a test on availability alone",
        ),
        Example(
            """
            import torch

            if torch.cuda.device_count() > 1 and torch.cuda.is_available() or force:
                model = torch.nn.DataParallel(model)
            """,
            None,
        ),
    ]
    valid = [
        "import torch\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
        "import torch\ndevice = 'cuda' if torch.cuda.is_available() and torch.cuda.device_count() > 0 else 'cpu'\n",
        "import torch_xla.runtime as xr\nreal = xr.device_type() != 'CPU'\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.qualname(node.func) != "torch.cuda.is_available" or node.args:
            return
        if in_availability_choice(self.ctx):
            return  # TX101 replaces the whole `'cuda' if ... else 'cpu'`
        parent = self.ctx.parent
        if isinstance(parent, cst.BooleanOperation) and isinstance(parent.operator, cst.And):
            other = parent.left if parent.right is node else parent.right
            kept = other
            if parent.lpar and not other.lpar:
                kept = other.with_changes(lpar=parent.lpar, rpar=parent.rpar)
            self.report(
                node,
                "torch.cuda.is_available() is False on a TPU host: keep only the user's choice "
                "(torch_xla always has a device; xr.device_type() != 'CPU' tells whether it is an accelerator)",
                Fix((self.replace(parent, kept),), Safety.UNSAFE),
            )
            return
        negated = isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Not)
        test = parent if negated else node
        index = -3 if negated else -2
        holder = self.ctx.ancestors[index] if len(self.ctx.ancestors) >= -index else None
        fix = None
        if isinstance(holder, cst.IfExp) and holder.test is test:
            branch = holder.orelse if negated else holder.body
            fix = Fix((self.replace(holder, _keep_parens(holder, branch)),), Safety.UNSAFE)
        elif isinstance(holder, cst.If) and holder.test is test:
            fix = self._take_branch(holder, negated, index)
        message = ("torch.cuda.is_available() is False on a TPU host, so this CUDA branch never runs on XLA: decide what "
                   "the XLA port needs (torch_xla always has a device; xr.device_type() != 'CPU' tells whether it is an "
                   "accelerator)")
        if fix is not None:
            message += "; the unsafe fix keeps the CUDA branch"
        self.report(node, message, fix)

    def _take_branch(self, stmt: cst.If, negated: bool, index: int):
        """`if torch.cuda.is_available(): A [else: B]` -> A; `if not ...: A [else: B]` -> B."""
        block = self.ctx.ancestors[index - 1] if len(self.ctx.ancestors) >= 1 - index else None
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return None  # an `elif`, or a one-line suite
        if not isinstance(stmt.body, cst.IndentedBlock):
            return None
        if negated and isinstance(stmt.orelse, cst.If):
            return None  # `if not available: ... elif ...`
        alone = len(block.body) == 1

        def apply(updated: cst.CSTNode):
            assert isinstance(updated, cst.If)
            if negated:
                chosen = list(updated.orelse.body.body) if isinstance(updated.orelse, cst.Else) else []
            else:
                chosen = list(updated.body.body)  # type: ignore[union-attr]
            if not chosen:
                if alone and not isinstance(block, cst.Module):
                    return cst.SimpleStatementLine([cst.Pass()], leading_lines=updated.leading_lines)
                return cst.RemoveFromParent()
            first = chosen[0]
            chosen[0] = first.with_changes(leading_lines=[*updated.leading_lines, *first.leading_lines])
            return cst.FlattenSentinel(chosen)

        return Fix((self.replace(stmt, apply),), Safety.UNSAFE)


def _keep_parens(old: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    if old.lpar and not new.lpar:
        return new.with_changes(lpar=old.lpar, rpar=old.rpar)
    return new
