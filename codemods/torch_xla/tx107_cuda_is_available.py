from typing import Optional

import libcst as cst

from porter.astutil import walk
from porter.branches import take_branch
from porter.device_options import default_truth
from porter.rules import Example, Fix, Rule, Safety, Severity

from ._availability import answer, condition_top, flag_answer, fold, foldable, is_count
from ._tables import CUDA_RUNTIME_OBJECTS, cuda_qualname, emptied_if, in_availability_choice


class CudaIsAvailable(Rule):
    """
    ## What it does
    Ports the device selection made through availability tests. In the port the accelerator is
    the XLA device, so each test gets the answer it has there (`codemods/torch_xla/_availability`):
    `torch.cuda.is_available()` and `torch.accelerator.is_available()` are True,
    `torch.backends.mps.is_available()` / `is_built()` are False, and `torch.cuda.device_count()`
    compared with a number counts one device (one XLA device per process). The condition that
    holds the test is simplified with the user's own flags kept:

    - `use_cuda = not args.no_cuda and torch.cuda.is_available()` -> `use_cuda = not args.no_cuda`;
      `use_mps = not args.no_mps and torch.backends.mps.is_available()` -> `use_mps = False`, and
      a plain name bound only to such a constant (in its function, or at module level) reads as
      that constant in later conditions (`elif use_mps:` goes).
    - `if <True>: A [elif/else ...]` -> `A`; `if <False>: A` -> nothing (an enclosing `if flag:`
      it leaves empty goes too; `pass` where a block would be empty);
      `if <False>: A else: B` -> `B`; `if <False>: A elif C: D [...]` -> `if C: D [...]`;
      `elif <True>: A` -> `else: A`; `elif <False>: A [rest]` -> `[rest]`.
      So `if args.cuda and not torch.cuda.is_available(): sys.exit(...)` and
      `if not torch.cuda.is_available() and not torch.backends.mps.is_available(): ...` go.
    - `x if <True> else y` -> `x`; a stored or passed flag (`pin_memory=torch.cuda.is_available()`)
      -> `True`; a remaining condition is kept simplified (`if args.cuda and torch.cuda.is_available():`
      -> `if args.cuda:`).

    A flag variable of the script's own device options (`use_cuda = args.cuda`, what
    `args.cuda and torch.cuda.is_available()` folds to) that nothing in the file reads any more,
    once TX101 has ported the device choice that read it, goes.

    Comments stay: those above the statement, on the kept branch's header line and ending the
    kept branch; those of a dropped branch go with it. A test inside `'cuda' if ... else 'cpu'`
    is folded by TX101, which rewrites the choice as a whole. Reported without a fix: a test used
    as a value (`print(torch.cuda.is_available())`), and one whose `and`/`or` partner has side
    effects that would be lost.

    ## Why
    On a TPU host `torch.cuda.is_available()` is False, so a script that chooses its device
    by it (`use_cuda = not args.no_cuda and torch.cuda.is_available()`) runs on the CPU, and the
    rewritten loaders and moves then meet CPU tensors ("Check failed: device.type() == at::kXLA
    (cpu vs. xla)"). torch_xla has no "is an accelerator present" call that keeps the
    semantics: after `import torch_xla` a PJRT device is always selected (TPU, NEURON, else CPU;
    measured with `PJRT_DEVICE` unset: `xr.device_type()` is `'CPU'`), so the XLA device always
    exists. `torch_xla.device_count()` answers at least 1 and initializes the runtime (measured),
    which breaks a later `torch_xla.launch`. If the program must know whether a real
    accelerator is there, `xr.device_type() != 'CPU'` tells (it reads the selected PJRT device
    without initializing the runtime).

    ## Fix safety
    Safe: this is device placement, like TX101's `'cuda' if torch.cuda.is_available() else 'cpu'`
    -> `torch_xla.device()`. The port takes the accelerator path, on the XLA device, wherever the
    user did not opt out; the user's flags (`--no-cuda`, `--cpu`, `args.cuda`) are kept, so with
    the flag set the port runs on the CPU as the original did. What goes is what only a host
    without CUDA ran: the CPU/MPS branches of availability tests, with anything they did
    besides choosing the device (a message, a setting), and exits for a missing GPU. On a host
    without TPU the port runs on XLA:CPU, not eager CPU.
    """

    code = "TX107"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-is-available"
    target = "torch-xla"
    summary = "availability tests (cuda/mps/device_count) folded: the accelerator path is the XLA device, the user's flags kept"
    severity = Severity.ERROR
    needs_text = ("is_available", "is_built", "device_count", "cuda", "gpu", "mps")
    examples = [
        Example(
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--cuda", action="store_true")
            args = parser.parse_args()
            use_cuda = args.cuda and torch.cuda.is_available()
            model = torch.nn.Linear(2, 2)
            """,
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--cuda", action="store_true")
            args = parser.parse_args()
            model = torch.nn.Linear(2, 2)
            """,
            title="a device flag nothing reads any more (TX101 ported the choice that read it) goes",
        ),
        Example(
            """
            import sys
            import torch

            def main(args):
                use_cuda = not args.no_cuda and torch.cuda.is_available()
                use_mps = not args.no_mps and torch.backends.mps.is_available()
                args.cuda = not args.no_cuda and torch.cuda.is_available()
                if args.cuda and not torch.cuda.is_available():
                    sys.exit("--cuda given, but there is no GPU")
                if use_cuda:
                    device = torch.device("cuda")
                elif use_mps:
                    device = torch.device("mps")
                else:
                    device = torch.device("cpu")
                return device
            """,
            """
            import torch

            def main(args):
                use_cuda = not args.no_cuda
                use_mps = False
                args.cuda = not args.no_cuda
                if use_cuda:
                    device = torch.device("cuda")
                else:
                    device = torch.device("cpu")
                return device
            """,
            title="the user's flags are kept, MPS and the missing-GPU exit go",
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
            def step(images, target, gpu):
                # move the batch
                target = target.cuda(gpu, non_blocking=True)
                print("GPU")
                gpu = gpu
                return target
            """,
            title="a test on availability alone keeps the accelerator branch",
        ),
        Example(
            """
            import torch

            def place(model, args):
                # pick where the model runs
                if not torch.cuda.is_available() and not torch.backends.mps.is_available():
                    print("using CPU, this will be slow")
                    device = torch.device("cpu")
                # one process per GPU
                elif args.distributed:  # DDP
                    model.cuda()
                    device = torch.device("cuda")
                elif torch.backends.mps.is_available():
                    device = torch.device("mps")
                else:
                    model = model.cuda(args.gpu)
                    device = torch.device("cuda:{}".format(args.gpu))
                if args.gpu:
                    if not torch.cuda.is_available():
                        raise RuntimeError("no GPU")
                if torch.cuda.device_count() > 1:
                    model = torch.nn.DataParallel(model)
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
            title="`if not cuda and not mps: ... elif B: ...` becomes the `elif` chain; an `if flag:` left empty goes",
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
            title="`if available:` keeps its first branch; an `elif available:` becomes the `else:`, an `elif not available:` goes",
        ),
        Example(
            """
            import torch

            def loaders(args, train_set):
                kwargs = {"num_workers": 1, "pin_memory": True} if torch.cuda.is_available() else {}
                loader = torch.utils.data.DataLoader(train_set, pin_memory=torch.cuda.is_available(), **kwargs)
                if (torch.cuda.is_available() or torch.backends.mps.is_available()) and not args.cpu:
                    loader = wrap(loader)
                return loader
            """,
            """
            import torch

            def loaders(args, train_set):
                kwargs = {"num_workers": 1, "pin_memory": True}
                loader = torch.utils.data.DataLoader(train_set, pin_memory=True, **kwargs)
                if not args.cpu:
                    loader = wrap(loader)
                return loader
            """,
            title="tests inside expressions, a flag passed on",
        ),
        Example(
            """
            import torch

            print("CUDA:", torch.cuda.is_available())
            if probe() and torch.backends.mps.is_available():
                device = "mps"
            """,
            None,
            title="a test used as a value, or beside a call that must still run, is reported",
        ),
        Example(
            """
            import torch

            if torch.cuda.is_available():
                ngpus = torch.cuda.device_count()
            else:
                ngpus = 1
            """,
            """
            import torch

            ngpus = torch.cuda.device_count()
            """,
            unsafe=True,
            title=("a kept branch that asks CUDA for its device count: unsafe (0 on a TPU host until TX104's "
                   "unsafe rewrite of the count; the default port keeps the test, which takes the else branch)"),
        ),
    ]
    valid = [
        "import torch\ndevice = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n",
        "import torch\ndevice = 'cuda' if torch.cuda.is_available() and torch.cuda.device_count() > 0 else 'cpu'\n",
        "import torch_xla.runtime as xr\nreal = xr.device_type() != 'CPU'\n",
        "import torch\nn = torch.cuda.device_count()\n",
        "import torch\nuse_mps = False\nif use_mps:\n    a()\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if answer(node, self.ctx) is None and not is_count(node, self.ctx):
            return
        self._check(node)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        """``use_cuda = args.cuda`` (what ``args.cuda and torch.cuda.is_available()`` folds to)
        that nothing reads any more once TX101 has ported the device choice that read it: a flag
        of the script's own options (or a folded availability answer), it goes."""
        if len(node.body) != 1 or not isinstance(node.body[0], cst.Assign) or len(node.body[0].targets) != 1:
            return
        assign = node.body[0]
        target = assign.targets[0].target
        if not isinstance(target, cst.Name) or not _flag_value(assign.value, self.ctx):
            return
        if any(isinstance(n, cst.Name) and n.value == target.value and n is not target
               for n in walk(self.ctx.module, into_functions=True)):
            return
        self.report(node, f"`{target.value}` only held the script's CUDA flag, and nothing reads it once the device "
                          "choice is ported", Fix((self.remove_statement(node),)))

    def visit_Name(self, node: cst.Name) -> None:
        parent = self.ctx.parent
        if not isinstance(parent, (cst.If, cst.IfExp, cst.While, cst.BooleanOperation, cst.UnaryOperation)):
            return  # a flag read in a condition, not stored or called
        if flag_answer(node, self.ctx) is not None:
            self._check(node)

    def _check(self, node: cst.CSTNode) -> None:
        if in_availability_choice(self.ctx):
            return  # TX101 replaces the whole `'cuda' if ... else 'cpu'`
        anc = self.ctx.ancestors
        at = condition_top(self.ctx)
        top = anc[at]
        key: cst.CSTNode = node
        if isinstance(node, cst.Call) and answer(node, self.ctx) is None:
            parent = self.ctx.parent
            key = anc[-3] if isinstance(parent, cst.ComparisonTarget) and len(anc) >= 3 else parent
            if key is None or not foldable(key, self.ctx):
                return  # a count used as a number: TX104
        first = next((n for n in walk(top, into_functions=True) if self._key(n)), None)
        if first is not None and first is not key:
            return  # one finding per condition
        folded = fold(top, self.ctx)
        holder = anc[at - 1] if at >= 1 else None
        fix = None
        if isinstance(folded, bool):
            if isinstance(holder, cst.IfExp) and holder.test is top:
                branch = holder.body if folded else holder.orelse
                fix = Fix((self.replace(holder, _keep_parens(holder, branch)),))
            elif isinstance(holder, cst.If) and holder.test is top:
                fix = take_branch(self, holder, folded, at - 1, lambda anc, block: emptied_if(anc, block, self.ctx))
            elif _value_position(holder, top):
                fix = Fix((self.replace(top, cst.Name("True" if folded else "False")),))
        elif folded is not None:
            if isinstance(holder, (cst.If, cst.IfExp, cst.While)) and holder.test is top or _value_position(holder, top):
                fix = Fix((self.replace(top, folded),))
        message = ("CUDA/MPS availability test: on XLA the accelerator is the XLA device, always there "
                   "(torch_xla always has a device; xr.device_type() != 'CPU' tells whether it is a real accelerator)")
        kept = _kept_branch(holder, top, folded)
        query = next((q for n in walk(kept, into_functions=True) if isinstance(n, cst.Call)
                      for q in [cuda_qualname(n.func, self.ctx)] if q in _CUDA_QUERIES), None) if kept is not None else None
        if fix is not None and query is not None:
            # the branch kept asks CUDA what only TX104's unsafe rewrite answers for XLA (a device
            # count of 0 on a TPU host): the fold is safe only together with it
            fix = Fix(fix.edits, Safety.UNSAFE, imports=fix.imports, remove_imports=fix.remove_imports)
            message += (f"; the branch it keeps calls {query}(), which answers for CUDA (0 devices on a TPU host) "
                        "until TX104's unsafe rewrite: unsafe")
        runtime = self._runtime_object(kept, holder, top, folded)
        if fix is not None and runtime is not None:
            # the path the fold keeps runs CUDA's own streams, events or ranges, which the
            # original skipped without CUDA and which raise on a TPU host: not folded
            fix = None
            message += (f"; the code it guards calls {runtime}(), CUDA-only (TX805): port that code first, then "
                        "this test")
        if fix is None:
            message += "; decide what the XLA port needs here"
        else:
            message += "; the fix keeps the accelerator path and the user's own flags"
        self.report(node, message, fix)

    def _runtime_object(self, kept: Optional[cst.CSTNode], holder: Optional[cst.CSTNode], top: cst.CSTNode,
                        folded) -> Optional[str]:
        """A CUDA runtime object (an event, a stream, an NVTX range, a device context) called in
        the code the fold makes run: the branch kept, and for a flag stored from the test
        (`use_events = torch.cuda.is_available()`) or read in it, every block of the scope's
        `if flag:` (the events one block makes, another block records)."""
        guarded: list[cst.CSTNode] = [kept] if kept is not None else []
        flags = {x.value for x in walk(top) if isinstance(x, cst.Name) and flag_answer(x, self.ctx) is not None}
        if folded is True and isinstance(holder, cst.Assign) and holder.value is top and len(holder.targets) == 1 \
                and isinstance(holder.targets[0].target, cst.Name):
            flags.add(holder.targets[0].target.value)
        for flag in flags:  # every block the flag guards: one of them may hold what the others use
            fn = self.ctx.enclosing(cst.FunctionDef)
            scope: cst.CSTNode = fn.body if fn is not None else self.ctx.module
            guarded += [n.body for n in walk(scope, into_functions=True) if isinstance(n, cst.If)
                        and any(isinstance(x, cst.Name) and x.value == flag for x in walk(n.test))]
        for block in guarded:
            for n in walk(block, into_functions=True):
                if isinstance(n, cst.Call):
                    q = cuda_qualname(n.func, self.ctx)
                    if q in CUDA_RUNTIME_OBJECTS:
                        return q
        return None

    def _key(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Call) and answer(node, self.ctx) is not None:
            return True
        if isinstance(node, cst.Name) and flag_answer(node, self.ctx) is not None:
            return True
        return isinstance(node, cst.Comparison) and foldable(node, self.ctx)

# CUDA queries that have no safe XLA answer (TX104 rewrites device_count as an unsafe fix)
_CUDA_QUERIES = frozenset({"torch.cuda.device_count", "torch.cuda.current_device", "torch.cuda.get_device_name",
                           "torch.cuda.get_device_properties", "torch.cuda.get_device_capability",
                           "torch.cuda.mem_get_info"})


def _kept_branch(holder: Optional[cst.CSTNode], top: cst.CSTNode, folded) -> Optional[cst.CSTNode]:
    """The code a folded test keeps: the branch of its `if` / conditional expression."""
    if not isinstance(folded, bool) or not isinstance(holder, (cst.If, cst.IfExp)) or holder.test is not top:
        return None
    return holder.body if folded else holder.orelse


def _value_position(holder: Optional[cst.CSTNode], top: cst.CSTNode) -> bool:
    """``top`` is a value stored or passed on (`flag = ...`, `f(pin_memory=...)`, `return ...`),
    where a folded flag may stand."""
    if isinstance(holder, (cst.Assign, cst.AnnAssign, cst.Return)):
        return holder.value is top
    return isinstance(holder, cst.Arg) and holder.keyword is not None and holder.value is top


def _flag_value(value: cst.BaseExpression, ctx) -> bool:
    """A device flag of the script's own options: ``args.cuda``, ``not args.no_cuda``, and/or
    of them (porter.device_options.default_truth knows its value with the default flags),
    naming CUDA or the GPU, as a flag that chose a device does."""
    if default_truth(value, ctx) is None:
        return False
    names = [n.attr.value.lower() for n in walk(value) if isinstance(n, cst.Attribute)]
    return any(w in n for n in names for w in ("cuda", "gpu", "cpu", "mps", "accel", "device"))


def _keep_parens(old: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    if old.lpar and not new.lpar:
        return new.with_changes(lpar=old.lpar, rpar=old.rpar)
    return new
