from typing import Optional

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
    (`torch.cuda.is_available()` or `not torch.cuda.is_available()`, resolved through imports)
    gets an unsafe fix that keeps the CUDA branch: the port's accelerator is the XLA device, and
    the rules for what is inside (`.cuda()` -> TX102, ...) port that branch.

    - `if available: A [elif ...] [else: ...]` -> `A`; `x if available else y` -> `x`.
    - `if not available: A` -> nothing (`pass` where the block would be empty);
      `if not available: A else: B` -> `B`; `if not available: A elif C: D [...]` -> the `elif`
      chain itself, `if C: D [...]` (pytorch/examples' imagenet picks the CPU this way);
      `y if not available else x` -> `x`.
    - `elif available: A [...]` -> `else: A`; `elif not available: A [rest]` -> `[rest]` (the
      next `elif`/`else`, or nothing).

    Comments stay: those above the statement, on the kept branch's header line and ending the
    kept branch; those of a dropped branch go with it. Anywhere else (an `or`, a stored flag, a
    `while` test) it is reported.

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
    the CPU branch of an availability test: in an `if not available: ... elif C: ...` chain the
    CPU branch goes and the chain's first `elif` becomes the `if`. That is the port's intent
    (left in place, the CPU branch runs on a TPU host, where `is_available()` is False, and puts
    the model on the CPU while the data is on the XLA device: "Expected XLA tensor"), but it
    changes what a host without an accelerator runs, and anything the CPU branch did besides
    choosing the device (a message, a setting) is gone.
    """

    code = "TX107"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
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

            def place(model, args):
                # pick where the model runs
                if not torch.cuda.is_available():
                    print("using CPU, this will be slow")
                    device = torch.device("cpu")
                # one process per GPU
                elif args.distributed:  # DDP
                    model.cuda()
                    device = torch.device("cuda")
                else:
                    model = model.cuda(args.gpu)
                    device = torch.device("cuda:{}".format(args.gpu))
                return model, device
            """,
            """
            import torch

            def place(model, args):
                # pick where the model runs
                # one process per GPU
                if args.distributed:  # DDP
                    model.cuda()
                    device = torch.device("cuda")
                else:
                    model = model.cuda(args.gpu)
                    device = torch.device("cuda:{}".format(args.gpu))
                return model, device
            """,
            unsafe=True,
            title="`if not available: ... elif B: ...` becomes the `elif` chain, `if B: ...`",
        ),
        Example(
            """
            from torch.cuda import is_available

            if is_available():  # the CUDA path
                backend = "nccl"
                # tuned for GPUs
            elif has_mps:
                backend = "gloo"
            else:
                backend = "gloo"
            if args.cpu:
                run_on_cpu()
            # on a GPU host
            elif is_available():
                run_on_gpu()
            elif has_mps:
                run_on_mps()
            if args.cpu:
                run_on_cpu()
            elif not is_available():
                warn()
            else:  # the GPU path
                run_on_gpu()
            """,
            """
            from torch.cuda import is_available

            # the CUDA path
            backend = "nccl"
            # tuned for GPUs
            if args.cpu:
                run_on_cpu()
            # on a GPU host
            else:
                run_on_gpu()
            if args.cpu:
                run_on_cpu()
            else:  # the GPU path
                run_on_gpu()
            """,
            unsafe=True,
            title="`if available:` keeps its first branch; an `elif available:` becomes the `else:`, an `elif not available:` goes",
        ),
        Example(
            """
            import torch

            if not torch.cuda.is_available() or args.cpu:
                device = torch.device("cpu")
            elif args.distributed:
                device = torch.device("cuda", args.local_rank)
            """,
            None,
            title="a test that combines availability with something else is reported",
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
        "import torch\nif not torch.backends.mps.is_available():\n    a()\nelif b:\n    c()\n",
        "from torch.backends.mps import is_available\nif not is_available():\n    a()\nelif b:\n    c()\n",
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
        """Keep the CUDA branch of an `if` that tests availability alone (`negated`: `if not ...`).

        A statement `if available: A ... ` -> A; `if not available: A` -> nothing;
        `if not available: A else: B` -> B; `if not available: A elif C: ...` -> `if C: ...`.
        An `elif available: A ...` -> `else: A`; `elif not available: A [rest]` -> [rest].
        """
        anc = self.ctx.ancestors
        owner = anc[index - 1] if len(anc) >= 1 - index else None
        if isinstance(owner, cst.If) and owner.orelse is stmt:
            return Fix((self.replace(stmt, _elif_branch(negated)),), Safety.UNSAFE)
        if not isinstance(owner, (cst.IndentedBlock, cst.Module)):
            return None
        siblings = list(owner.body)
        at = next(i for i, s in enumerate(siblings) if s is stmt)
        alone = len(siblings) == 1
        carried: list[cst.EmptyLine] = []  # comment lines that lose their place, filled by `apply`

        def apply(updated: cst.CSTNode):
            assert isinstance(updated, cst.If)
            if negated and isinstance(updated.orelse, cst.If):
                # the `elif` chain is the whole statement now: `elif C:` -> `if C:`
                chain = updated.orelse
                return chain.with_changes(leading_lines=[*updated.leading_lines, *chain.leading_lines])
            if negated:
                suite = updated.orelse.body if isinstance(updated.orelse, cst.Else) else None
            else:
                suite = updated.body
            head, chosen, foot = _suite_parts(suite)
            if not chosen:
                if alone and not isinstance(owner, cst.Module):
                    return cst.SimpleStatementLine([cst.Pass()], leading_lines=updated.leading_lines)
                carried.extend(updated.leading_lines)
                return cst.RemoveFromParent()
            first = chosen[0]
            chosen[0] = first.with_changes(leading_lines=[*updated.leading_lines, *head, *first.leading_lines])
            carried.extend(foot)
            return cst.FlattenSentinel(chosen)

        # comments that ended the kept block (or stood above a removed statement) go before the next
        # statement, or to the end of the enclosing block
        kept = stmt.body if not negated else stmt.orelse.body if isinstance(stmt.orelse, cst.Else) else None
        removed = negated and stmt.orelse is None and not (alone and isinstance(owner, cst.IndentedBlock))
        if not (isinstance(kept, cst.IndentedBlock) and kept.footer) and not (removed and stmt.leading_lines):
            return Fix((self.replace(stmt, apply),), Safety.UNSAFE)
        if at + 1 < len(siblings):
            carry = self.replace(siblings[at + 1], lambda n: n.with_changes(leading_lines=[*carried, *n.leading_lines]))
        else:
            carry = self.replace(owner, lambda n: n.with_changes(footer=[*carried, *n.footer]))
        return Fix((self.replace(stmt, apply), carry), Safety.UNSAFE)


def _elif_branch(negated: bool):
    """The replacement of an `elif` that tests availability alone; its own leading comments
    go with it when its branch is dropped."""

    def apply(updated: cst.CSTNode):
        assert isinstance(updated, cst.If)
        if not negated:
            return cst.Else(body=updated.body, leading_lines=updated.leading_lines,
                            whitespace_before_colon=updated.whitespace_after_test)
        return updated.orelse if updated.orelse is not None else cst.RemoveFromParent()

    return apply


def _suite_parts(suite: Optional[cst.BaseSuite]) -> tuple[list[cst.EmptyLine], list[cst.BaseStatement], list[cst.EmptyLine]]:
    """A branch's statements as block statements, with the comment on its header line (as a
    comment line to put before them) and the comment lines that end it."""
    if suite is None:
        return [], [], []
    if isinstance(suite, cst.SimpleStatementSuite):
        return [], [cst.SimpleStatementLine(list(suite.body), trailing_whitespace=suite.trailing_whitespace)], []
    assert isinstance(suite, cst.IndentedBlock)
    head = []
    if suite.header.comment is not None:
        head.append(cst.EmptyLine(indent=True, comment=suite.header.comment))
    return head, list(suite.body), list(suite.footer)


def _keep_parens(old: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    if old.lpar and not new.lpar:
        return new.with_changes(lpar=old.lpar, rpar=old.rpar)
    return new
