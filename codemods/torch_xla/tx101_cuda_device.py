from typing import Optional

import libcst as cst

from porter.astutil import arg
from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Safety, Severity

from ._availability import fold
from ._device_strings import DEVICE_READ, device_string_fact, xla_string
from ._devices import PROVABLE, int_ordinal, used_as_device_type
from ._tables import (CURRENT_ACCELERATOR, TORCH_XLA, choice_replacement, defaults_choose_cpu, device_choice, is_cuda_string,
                      side_effect_free, string_node, xla_device_expr)


class CudaDevice(Rule):
    """
    ## What it does
    Rewrites CUDA device objects to the XLA device:
    `torch.device('cuda')`, `torch.device('cuda:0')`, `torch.device('cuda', rank)` and
    `torch.device(f'cuda:{rank}')` become `torch_xla.device()`. The idiom
    `torch.device('cuda' if torch.cuda.is_available() else 'cpu')` (or the same choice between
    two strings) becomes `torch_xla.device()`; when the condition also holds a user's choice
    (`'cuda' if use_cuda else 'cpu'`) the choice is kept:
    `torch_xla.device() if use_cuda else torch.device('cpu')`. Where that choice is an opt-in
    flag of the script's own (`'cuda' if args.cuda else 'cpu'`, a `store_true` option: the CPU
    with the default flags; `and`/`or`/`not` of such flags alike), both arms are the XLA
    device: `python port.py` trains on the TPU by default, as the GPU user who passed `--cuda`
    did. A force-CPU flag (`'cpu' if args.cpu else 'cuda'`, the accelerator by default) stays
    the user's choice.

    A CUDA `torch.device(...)` that is a parameter's default value becomes `torch.device('xla')`.

    `torch.accelerator.current_accelerator()` (torch 2.6+'s device-generic spelling) becomes
    `torch.device('xla')`: the same device for `.to()` and `device=`, and its `.type`, `str()`
    and `f'{acc}:{i}'` read 'xla' as they read 'cuda' before.

    ## Why
    There is no CUDA device on a TPU host; the port must run on the XLA device. Under PJRT
    every process owns its device(s), so a CUDA index or rank is not needed: inside a process
    started by `torch_xla.launch`, `torch_xla.device()` is that process's device. Importing
    torch_xla always selects a PJRT device (TPU, NEURON or, failing those, CPU; measured: with
    `PJRT_DEVICE` unset `xr.device_type()` is `'CPU'` after import), so an availability test
    alone has nothing left to decide.

    `torch.device(<int>)` (a CUDA device number: a literal, or a name bound to `int(...)`,
    `dist.get_rank()`... in its scope; see TX103) becomes `torch_xla.device()` too, with an
    unsafe fix where the name (a parameter `rank`, `args.gpu`) says it by its spelling only.
    Availability tests inside the choice are folded as TX107 folds them
    (`'cuda' if use_cuda and torch.cuda.is_available() else 'cpu'` keeps `use_cuda` only).

    An `if`/`else` whose two arms are the same code once their CUDA devices are the XLA device
    (`if args.gpu is not None: torch.device(f'cuda:{args.gpu}') else: torch.device('cuda')`) keeps
    one arm (when its test has no side effects).

    A choice bound to a name that the file uses as a string (passed as `device_type=`, the
    first argument of `torch.autocast`/`torch.amp.GradScaler`, compared with a string:
    `device_type == 'cpu'`, searched: `'cuda' in device`, given to a method of str:
    `device.startswith('cuda')`, `device.split(':')`, or sliced), or given as `device_type=`
    itself, keeps a string: `device_type = 'cuda' if ... else 'cpu'` becomes
    `'xla' if ... else 'cpu'`, `device = 'cuda' if torch.cuda.is_available() else 'cpu'`
    becomes `device = 'xla'` (a torch.device has no `in`, `startswith` or slicing)
    (`torch.autocast(device_type=torch_xla.device())` raises "Expected `device_type` of type
    `str`"; `torch.device('xla')` and `.to('xla')` accept the string too).

    ## Fix safety
    Safe. Code that only chose between CUDA and CPU by availability now always takes the XLA
    device (on a host without TPU that is XLA:CPU). A choice that includes a user flag is kept,
    except an opt-in accelerator flag, which the port no longer needs: it trains on XLA with the
    default flags and with the flag (a flag that forces the CPU keeps its meaning).
    Note that `torch_xla.device()` initializes the XLA runtime: at module level of a script that
    later calls `torch_xla.launch`, move the device line into the launched function. A default
    value runs when the `def` does, at import: `torch.device('xla')` there is the same device as
    `torch_xla.device()` once torch_xla is imported, without starting the runtime.
    """

    code = "TX101"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-device"
    target = "torch-xla"
    summary = "torch.device('cuda'...) and 'cuda' if available else 'cpu' -> torch_xla.device()"
    severity = Severity.ERROR
    needs_text = ("cuda", "device(", "accelerator")
    examples = [
        Example(
            """
            import torch

            def train_one_epoch(model, loader, device=torch.device("cuda"), eval_device=torch.device("cuda:0")):
                return model, loader, device, eval_device
            """,
            """
            import torch

            def train_one_epoch(model, loader, device=torch.device("xla"), eval_device=torch.device("xla")):
                return model, loader, device, eval_device
            """,
            title="a default parameter keeps a device object",
        ),
        Example(
            """
            import torch

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            """,
            """
            import torch_xla

            device = torch_xla.device()
            """,
            title="availability only",
        ),
        Example(
            """
            import torch

            def main(args):
                use_cuda = args.use_cuda
                device = torch.device("cuda" if use_cuda else "cpu")
            """,
            """
            import torch
            import torch_xla

            def main(args):
                use_cuda = args.use_cuda
                device = torch_xla.device() if use_cuda else torch.device("cpu")
            """,
            title="the user's choice is kept",
        ),
        Example(
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--cuda", action="store_true", help="use CUDA")
            parser.add_argument("--cpu", action="store_true", help="force the CPU")
            args = parser.parse_args()
            device = torch.device("cuda" if args.cuda else "cpu")
            other = torch.device("cpu" if args.cpu else "cuda")
            """,
            """
            import argparse
            import torch
            import torch_xla

            parser = argparse.ArgumentParser()
            parser.add_argument("--cuda", action="store_true", help="use CUDA")
            parser.add_argument("--cpu", action="store_true", help="force the CPU")
            args = parser.parse_args()
            device = torch_xla.device()
            other = torch.device("cpu") if args.cpu else torch_xla.device()
            """,
            title="an opt-in flag (the CPU with the default flags): XLA on both arms; a force-CPU flag is kept",
        ),
        Example(
            """
            import torch

            def worker(rank):
                a = torch.device("cuda", rank)
                b = torch.device(f"cuda:{rank}")
                c = torch.device("cuda:0")
                d = torch.device(0)
                local = int(os.environ["LOCAL_RANK"])
                e = torch.device(local)
            """,
            """
            import torch_xla

            def worker(rank):
                a = torch_xla.device()
                b = torch_xla.device()
                c = torch_xla.device()
                d = torch_xla.device()
                local = int(os.environ["LOCAL_RANK"])
                e = torch_xla.device()
            """,
        ),
        Example(
            """
            import torch

            def place(args):
                if args.gpu is not None:
                    device = torch.device("cuda:{}".format(args.gpu))
                else:
                    device = torch.device("cuda")
                return device
            """,
            """
            import torch_xla

            def place(args):
                device = torch_xla.device()
                return device
            """,
            title="arms that both become the XLA device are one",
        ),
        Example(
            """
            import torch

            device = torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"
            acc = torch.accelerator.current_accelerator()
            gpu = torch.device(f"{acc}:0")
            """,
            """
            import torch

            device = "xla" if torch.accelerator.is_available() else "cpu"
            acc = torch.device("xla")
            gpu = torch.device(f"{acc}:0")
            """,
            title="torch.accelerator's device is the XLA device (TX107 folds the availability test)",
        ),
        Example(
            """
            import torch

            DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
            x = torch.zeros(3).to("cpu" if args.cpu else "cuda")
            """,
            """
            import torch
            import torch_xla

            DEVICE = torch_xla.device()
            x = torch.zeros(3).to("cpu" if args.cpu else torch_xla.device())
            """,
            title="a choice between two strings",
        ),
        Example(
            """
            import torch

            device_type = "cuda" if "cuda" in args.device else "cpu"
            ctx = torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)
            kind = 'cuda' if torch.cuda.is_available() else 'cpu'
            if kind == 'cpu':
                print("slow")
            cfg.amp_device = "cpu" if args.cpu else "cuda"
            scaler = torch.amp.GradScaler(cfg.amp_device)
            with torch.autocast(device_type="cuda" if torch.cuda.is_available() else "cpu"):
                pass
            """,
            """
            import torch

            device_type = "xla" if "cuda" in args.device else "cpu"
            ctx = torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)
            kind = 'xla'
            if kind == 'cpu':
                print("slow")
            cfg.amp_device = "cpu" if args.cpu else "xla"
            scaler = torch.amp.GradScaler(cfg.amp_device)
            with torch.autocast(device_type="xla"):
                pass
            """,
            title="a name used as a device type (device_type=, compared with a string) stays a string: 'xla'",
        ),
        Example(
            """
            import torch

            device = 'cuda' if torch.cuda.is_available() else 'cpu'
            pin = 'cuda' in device
            dev = "cuda:0" if torch.cuda.is_available() else "cpu"
            print("on", dev.split(":")[0], dev[:4])
            """,
            """
            device = 'xla'
            pin = 'cuda' in device
            dev = "xla"
            print("on", dev.split(":")[0], dev[:4])
            """,
            title="a device string read as text ('cuda' in device, a str method, a slice) stays a string: 'xla'",
        ),
    ]
    valid = [
        "import torch\ndevice = torch.device('cpu')\n",
        "import torch\ndevice = torch.device(args.device)\n",
        "import torch_xla\ndevice = torch_xla.device()\n",
        "device = torch.device('cuda')\n",  # `torch` not imported: not resolved
        "import torch\nmode = 'cuda' if fast else 'slow'\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        name = self.ctx.qualname(node.func)
        if name == CURRENT_ACCELERATOR:
            parent = self.ctx.parent
            if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "type":
                return  # visit_Attribute: the type string
            # a CUDA build of torch answers 'cuda' on any host; torch.device('xla') starts no runtime
            torch_ = self.ctx.module_alias("torch")
            self.report(node, "torch.accelerator.current_accelerator() is the CUDA device on a CUDA build of torch, "
                        "GPU or not: on XLA the accelerator is torch.device('xla')",
                        Fix((self.replace(node, cst.parse_expression(f'{torch_}.device("xla")')),)))
            return
        if name != "torch.device":
            return
        first = arg(node, "type", 0)
        if first is None:
            return
        parent = self.ctx.parent
        if isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "map_location":
            return  # TX105: torch.load cannot map onto an XLA device
        if is_cuda_string(first.value) and isinstance(parent, cst.Param) and parent.default is node:
            # a default value is evaluated at import: torch_xla.device() there would start the XLA runtime
            self.report(node, "CUDA device on XLA: a default parameter's torch.device('xla') is the process's XLA "
                        "device, without starting the runtime at import", Fix((self.replace(first.value, xla_string(first.value)),)))
            return
        if is_cuda_string(first.value):
            self.report(
                node,
                "CUDA device on XLA: use torch_xla.device() (each XLA process owns its device; no index needed)",
                Fix((self.replace(node, xla_device_expr(self.ctx)),), imports=(TORCH_XLA,)),
            )
            return
        if device_string_fact(self.ctx).get(first.value) == DEVICE_READ:
            return  # `device = 0; torch.device(device)`: TX103 makes the variable 'xla'
        ordinal = int_ordinal(first.value, self.ctx)
        if ordinal is not None and len(node.args) == 1:
            self.report(node, "torch.device(<int>) is a CUDA device number: on XLA use torch_xla.device()",
                        Fix((self.replace(node, xla_device_expr(self.ctx)),),
                            Safety.SAFE if ordinal == PROVABLE else Safety.UNSAFE, imports=(TORCH_XLA,)))
            return
        choice = device_choice(first.value, self.ctx)
        if choice is None:
            return
        cpu_string = choice.node.orelse if choice.cuda_first else choice.node.body
        cpu = node.with_changes(args=[cst.Arg(cpu_string)])
        folded = fold(choice.node.test, self.ctx)
        new = choice_replacement(choice, self.ctx, cpu, folded)
        self.report(node, self._choice_message(choice, folded), Fix((self.replace(node, new),), imports=(TORCH_XLA,)))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        value = node.value
        if (node.attr.value == "type" and isinstance(value, cst.Call)
                and self.ctx.qualname(value.func) == CURRENT_ACCELERATOR):
            self.report(node, "torch.accelerator.current_accelerator().type is 'cuda' on a CUDA build of torch, GPU or "
                        "not: on XLA the accelerator's type is 'xla'", Fix((self.replace(node, string_node("xla")),)))

    def visit_IfExp(self, node: cst.IfExp) -> None:
        choice = device_choice(node, self.ctx)
        if choice is None:
            return
        parent = self.ctx.parent
        grand = self.ctx.ancestors[-3] if len(self.ctx.ancestors) >= 3 else None
        if isinstance(parent, cst.Arg) and isinstance(grand, cst.Call) and self.ctx.qualname(grand.func) == "torch.device":
            return  # handled as a whole in visit_Call
        if isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "map_location":
            return  # TX105: torch.load cannot map onto an XLA device
        if not any(v == "torch" or v.startswith("torch.") for v in self.ctx.aliases.values()):
            return
        cpu = choice.node.orelse if choice.cuda_first else choice.node.body
        cuda = choice.node.body if choice.cuda_first else choice.node.orelse
        # a name the file uses as a device type (`device_type=`, `== 'cpu'`) stays a string
        kind = _bound_name(parent, node)
        as_type = used_as_device_type(self.ctx, kind)
        if isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "device_type":
            kind, as_type = "device_type", True
        elif _option_default(parent, grand):
            # a command-line option's default: the value the user may give instead is a string
            # (`--device cpu`), and the script may use it as one (`args.device.startswith(...)`)
            kind, as_type = "the option's default", True
        xla = string_node("xla", cuda) if as_type else None
        folded = fold(choice.node.test, self.ctx)
        new = choice_replacement(choice, self.ctx, cpu, folded, xla)
        if isinstance(new, cst.IfExp) and (node.lpar or isinstance(parent, (cst.IfExp, cst.BinaryOperation, cst.Comparison, cst.UnaryOperation, cst.BooleanOperation))):
            new = new.with_changes(lpar=node.lpar or [cst.LeftParen()], rpar=node.rpar or [cst.RightParen()])
        if as_type and kind == "the option's default":
            self.report(node, "CUDA-or-CPU default of a command-line option: a string like the values the option "
                        "takes ('cpu', 'cuda:0'); on XLA it is 'xla' (torch.device('xla'), .to('xla'))",
                        Fix((self.replace(node, new),)))
            return
        if as_type:
            self.report(node, f"CUDA-or-CPU device string: {kind} is used as a string (device_type=, compared "
                        "with or searched for a string, a str method): on XLA it is 'xla'", Fix((self.replace(node, new),)))
            return
        self.report(node, self._choice_message(choice, folded), Fix((self.replace(node, new),), imports=(TORCH_XLA,)))

    def visit_If(self, node: cst.If) -> None:
        """`if c: device = torch_xla.device() else: device = torch_xla.device()`: the CUDA
        choices both became the XLA device, so the arms are the same code; keep one."""
        other = node.orelse
        if not isinstance(other, cst.Else) or not isinstance(node.body, cst.IndentedBlock):
            return
        if not isinstance(other.body, cst.IndentedBlock) or not side_effect_free(node.test, self.ctx):
            return
        if self.ctx.parent is not None and isinstance(self.ctx.parent, cst.If):
            return  # an `elif`
        code = cst.Module([]).code_for_node
        body = [code(s) for s in node.body.body]
        if body != [code(s) for s in other.body.body]:
            return
        alias = self.ctx.module_alias(TORCH_XLA)
        if not any(f"{alias}.device()" in line for line in body):
            return  # identical arms of the user's own making are the user's
        kept = list(node.body.body)
        kept[0] = kept[0].with_changes(leading_lines=[*node.leading_lines, *kept[0].leading_lines])
        self.report(node, "both arms of this `if` place on the XLA device now: one is enough",
                    Fix((self.replace(node, cst.FlattenSentinel(kept)),)))

    def _choice_message(self, choice, folded: object) -> str:
        if choice.availability_only:
            return "CUDA-or-CPU by availability: on XLA use torch_xla.device() (torch_xla always provides a device)"
        if defaults_choose_cpu(choice, self.ctx, folded):
            return ("CUDA-or-CPU by an opt-in flag (the CPU with the script's default flags): on a TPU host the port "
                    "trains on XLA by default, torch_xla.device() on both arms")
        return "CUDA-or-CPU by a user's choice: the CUDA branch becomes torch_xla.device(), the choice is kept"


def _option_default(parent: object, grand: object) -> bool:
    """The node is the `default=` of an `add_argument(...)` call (argparse's, click's option
    alike: a parser method named add_argument)."""
    return (isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "default"
            and isinstance(grand, cst.Call) and isinstance(grand.func, cst.Attribute)
            and grand.func.attr.value == "add_argument")


def _bound_name(parent: object, node: cst.CSTNode) -> Optional[str]:
    """The name (``device_type``, ``args.device_type``) that ``node`` is the whole value of."""
    if isinstance(parent, cst.Assign) and parent.value is node and len(parent.targets) == 1:
        return dotted_name(parent.targets[0].target)
    if isinstance(parent, cst.AnnAssign) and parent.value is node:
        return dotted_name(parent.target)
    return None
