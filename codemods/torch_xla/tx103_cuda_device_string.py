import libcst as cst

from porter.astutil import arg, code, string_value
from porter.device_options import default_truth
from porter.rules import Edit, Example, Fix, Rule, Safety, Severity

from ._device_strings import (DEVICE_READ, DEVICE_TEST, DEVICE_VALUE, OTHER_USE, device_string_fact, option_blocker,
                              returned, xla_string)
from ._devices import PROVABLE, SPELLING, int_ordinal, placement_expr
from ._tables import TORCH_XLA, imports_torch, is_cuda_string, is_string

# Tensor methods whose `device` argument places the result.
_METHODS = ("to", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor")


class CudaDeviceString(Rule):
    """
    ## What it does
    Rewrites CUDA device strings where a device is passed: `.to('cuda')`, `.to('cuda:0')`,
    `.to(device='cuda')`, and `device='cuda'` in calls of torch functions
    (`torch.zeros/ones/randn/arange/tensor/empty/full/...`) and of tensor `new_*` methods,
    to `torch_xla.device()`.

    A CUDA string stored in a variable (`device = 'cuda'`, a script's configuration value that
    a configurator or `--device=` may override; `device = f'cuda:{local_rank}'`;
    `device: str = 'cuda:0'`) becomes `'xla'` where every read of the variable in its scope is
    a device use: `torch.device(device)`, `.to(device)`, `device=device` in a torch call or a
    tensor's `new_*`/`.to`, `torch.load(map_location=device)`, `torch.cuda.set_device(device)`;
    a device-type test (`'cuda' in device`, `device == 'cuda'`, `device in ('cuda', 'mps')`,
    `device.startswith('cuda')`), whose CUDA literal becomes `'xla'` too, so the port takes the
    accelerator path; or text (`print(device)`, `f'{device}'`); or an argument of a function of
    the file whose parameter is read only in these ways (`train(model, device)` with `def
    train(model, device): ... x.to(device)`). A variable read in any other way (passed to
    another function of the program, stored, returned) keeps its string, and that read is
    reported. Other CUDA strings (a default parameter `device='cuda'`, `device='cuda'` passed to
    a function of the program) are reported.

    A function of the file that returns device strings (`def get_device(): if
    torch.cuda.is_available(): return 'cuda'; return 'cpu'`, or `return 'cuda' if ... else
    'cpu'`), whose name is only ever called and each call's value is a device use, a
    device-type test or text, or is bound to a variable read only in these ways (`device =
    get_device()` then `.to(device)`), returns `'xla'` where it returned a CUDA string (a
    conditional whose arms all become `'xla'` becomes that one value). Where a call's value
    is also passed on or stored, the returned CUDA string is reported.

    A command-line default (`parser.add_argument('--device', default='cuda')`, on a parser or
    an argument group, any option string or `dest=`) becomes `'xla'` where every read of the
    option in the file is a device use or text, and the parsed namespace is followed from
    `parse_args()` through assignments, returns and the parameters of the file's functions to
    uses porter knows: a library's device setup that accepts 'xla' (timm's
    `utils.init_distributed_device(args)`), functions that read other options only, records
    (a checkpoint's args, `yaml.safe_dump(vars(args))`, `wandb.init(config=args)`), `getattr`
    of another option; the option under another name (`device_name = args.device`) read in
    these ways or tested against other devices' strings only (`device_name == 'mps'`, which
    'xla' fails as 'cuda' did). A device-type test of the option (`args.device == 'cuda'`,
    `args.device.startswith('cuda')`), the option copied to a variable, `vars(args)` or the
    namespace handed to code porter does not know, or `choices=` without 'xla' keep the default,
    and the finding at the option quotes the first such read; its fix is then unsafe.

    The other values such a variable may take are kept as the user chose them: another device
    string (`if args.cuda: device = 'cuda' elif args.mps: device = 'mps' else: device = 'cpu'`)
    or a `torch.device(...)` of it (`device = torch.device(device)`), with one exception: where
    every test of such a chain reads the file's own boolean flags (`store_true` /
    `store_false` options, `and`/`or`/`not` of them) and is False with their defaults, its final
    `else: device = 'cpu'` is what the script runs with by default, and becomes 'xla' too (a
    `--cpu` arm the user can choose stays); a chain whose every other branch is CUDA becomes the
    one assignment `device = 'xla'`. The same chain of device objects (`if args.cuda: device =
    torch.device('cuda') else: device = torch.device('cpu')`, as a Gluon script's
    `mx.gpu(0)` / `mx.cpu()` choice ports) gets `torch_xla.device()` there. A variable bound to CUDA
    device numbers only (`device = 0`) that the file reads as a device and in no other way
    becomes `'xla'` the same way.

    Integer devices are CUDA device numbers: `.to(0)`, `.to(local_rank)`, `device=rank`. A
    literal, or a plain name every binding of which in its scope is an integer literal or a
    call of `int(...)` (`local_rank = int(os.environ['LOCAL_RANK'])`), `dist.get_rank()`,
    `xr.global_ordinal()`, is provably one: a safe fix; so is an attribute `self.gpu_id` that
    the class only ever sets to such a value (a trainer's `self.gpu_id = int(os.environ[...])`). A parameter named `rank`, `local_rank`,
    `gpu`, `gpu_id`, `device_id`, `local_gpu` or `gpu_index` (say the `rank` of a function that
    `mp.spawn` starts), or such an attribute of the parsed arguments (`args.gpu`,
    `args.local_rank`), is read as one by its spelling alone: an unsafe fix. The device used is
    the script's device variable `device` where the code can read one (a parameter, an
    earlier `device = ...` in the function, a module-level one), else `torch_xla.device()`.

    ## Why
    A TPU host has no CUDA device. The XLA device of the process is `torch_xla.device()`.
    `torch.Generator(device='cuda')` is reported: an XLA device cannot hold a Generator
    (measured: `RuntimeError: XLA device type not an accelerator`).
    `'xla'` is a device string that `torch.device`, `.to` and the factories accept once torch_xla
    is imported: the process's XLA device, as `torch_xla.device()` (each PJRT process owns one
    device, so a CUDA ordinal has no counterpart). A string that is used as something else than
    a device may mean something else than a device elsewhere, and `torch_xla.device()` in a
    default parameter would initialize the XLA runtime at import, so those are left to a person.

    ## Fix safety
    Safe: the tensor is created on / moved to the XLA device (or the script's device variable,
    so the tensor meets the model wherever the user's flag put it) instead of the CUDA device.
    Unsafe for an integer device known by its name's spelling only. Safe for a stored string
    read only as a device: the same code runs with 'xla' in place of 'cuda', the device-type
    tests choose the accelerator path as they did on the GPU, and a device the user sets (a
    configurator's `--device=cpu`) still applies (`'xla' in 'cpu'` is false as `'cuda' in 'cpu'`
    was). Safe for the `else: device = 'cpu'` the default flags choose: the port runs on XLA what
    the original ran on the CPU (as TX109 places a CPU-only script), and each flag the user passes
    still selects its own branch. Safe for a command-line default every read of which is a device use, text or a use
    porter knows (timm 1.0.31's `init_distributed_device` asserts CUDA for 'cuda' only and
    returns `torch.device(args.device)`, 'xla' or the 'cpu' the user passes): the port places
    on 'xla' what the original placed on 'cuda', and `--device cpu` still gives the CPU.
    Unsafe for one porter cannot follow: the option may be read where porter does not look
    (a function given the namespace, a test of the option for 'cuda'), and each such read now
    sees 'xla'; a `--device` the user passes still applies.
    """

    code = "TX103"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "cuda-device-string"
    target = "torch-xla"
    summary = ".to('cuda') / device='cuda' in torch calls -> torch_xla.device()"
    severity = Severity.ERROR
    needs_text = ("cuda", ".to(", "device=")
    examples = [
        Example(
            """
            import torch

            x = torch.zeros(4, 4, device="cuda")
            y = torch.arange(10, device=f"cuda:{rank}")
            z = x.to("cuda:0", non_blocking=True)
            w = x.new_zeros(3, device="cuda")
            """,
            """
            import torch
            import torch_xla

            x = torch.zeros(4, 4, device=torch_xla.device())
            y = torch.arange(10, device=torch_xla.device())
            z = x.to(torch_xla.device(), non_blocking=True)
            w = x.new_zeros(3, device=torch_xla.device())
            """,
        ),
        Example(
            """
            import os
            import torch

            def worker(model, batch):
                local_rank = int(os.environ["LOCAL_RANK"])
                model = model.to(local_rank)
                mask = torch.ones(4, device=local_rank)
                return model(batch.to(0)) * mask

            def step(device, x):
                return x.to("cuda", non_blocking=True)
            """,
            """
            import os
            import torch
            import torch_xla

            def worker(model, batch):
                local_rank = int(os.environ["LOCAL_RANK"])
                model = model.to(torch_xla.device())
                mask = torch.ones(4, device=torch_xla.device())
                return model(batch.to(torch_xla.device())) * mask

            def step(device, x):
                return x.to(device, non_blocking=True)
            """,
            title="integer device numbers; the script's device variable where there is one",
        ),
        Example(
            """
            import os
            import torch

            class Trainer:
                def __init__(self, model):
                    self.gpu_id = int(os.environ["LOCAL_RANK"])
                    self.model = model.to(self.gpu_id)

                def run_batch(self, source):
                    return self.model(source.to(self.gpu_id))
            """,
            """
            import os
            import torch
            import torch_xla

            class Trainer:
                def __init__(self, model):
                    self.gpu_id = int(os.environ["LOCAL_RANK"])
                    self.model = model.to(torch_xla.device())

                def run_batch(self, source):
                    return self.model(source.to(torch_xla.device()))
            """,
            title="an attribute every method of the class sets to an int(...): a device number (safe)",
        ),
        Example(
            """
            import torch

            def run(rank, args, model, x):
                model.to(rank)
                return model(x.to(args.gpu))
            """,
            """
            import torch
            import torch_xla

            def run(rank, args, model, x):
                model.to(torch_xla.device())
                return model(x.to(torch_xla.device()))
            """,
            unsafe=True,
            title="names that say GPU number by their spelling: unsafe",
        ),
        Example(
            """
            import torch

            DEVICE = "cuda"

            def evaluate(model, device="cuda:0"):
                return build(device="cuda")

            gen = torch.Generator(device="cuda")
            parser.add_argument("--device", default="cuda:0", help="device to train on")
            """,
            None,
            title="strings that may be used as strings are reported",
        ),
        Example(
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="cuda", help="device to train on")
            parser.add_argument("--eval-device", type=str, default=f"cuda:{0}")
            args = parser.parse_args()
            setup_distributed(args)
            """,
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="xla", help="device to train on")
            parser.add_argument("--eval-device", type=str, default="xla")
            args = parser.parse_args()
            setup_distributed(args)
            """,
            unsafe=True,
            title="a command-line default read where porter cannot follow it becomes 'xla' as an unsafe fix",
        ),
        Example(
            """
            import argparse
            import torch
            from timm import utils

            parser = argparse.ArgumentParser()
            group = parser.add_argument_group("Device parameters")
            group.add_argument("--device", default="cuda", type=str)

            def main():
                args = parser.parse_args()
                device = utils.init_distributed_device(args)
                print(f"training on {args.device}")
                train(model.to(args.device), args)

            def train(model, cfg):
                noise = torch.randn(4, device=cfg.device)
            """,
            """
            import argparse
            import torch
            from timm import utils

            parser = argparse.ArgumentParser()
            group = parser.add_argument_group("Device parameters")
            group.add_argument("--device", default="xla", type=str)

            def main():
                args = parser.parse_args()
                device = utils.init_distributed_device(args)
                print(f"training on {args.device}")
                train(model.to(args.device), args)

            def train(model, cfg):
                noise = torch.randn(4, device=cfg.device)
            """,
            title="a command-line default every read of which is a device use becomes 'xla'",
        ),
        Example(
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--device", type=str, default="cuda", help="training device")
            opt = parser.parse_args()
            device_name = opt.device
            device = torch.device(device_name)
            model = Net().to(device_name)
            print(f"training on {device_name}")
            """,
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--device", type=str, default="xla", help="training device")
            opt = parser.parse_args()
            device_name = opt.device
            device = torch.device(device_name)
            model = Net().to(device_name)
            print(f"training on {device_name}")
            """,
            title="the option under another name, read only as a device, is the option itself",
        ),
        Example(
            """
            import os
            import torch

            device = 'cuda'  # overridden by --device=...
            exec(open('configurator.py').read())
            if int(os.environ.get('LOCAL_RANK', -1)) >= 0:
                device = f'cuda:{os.environ["LOCAL_RANK"]}'
            accelerated = 'cuda' in device and device != 'cpu'
            model.to(torch.device(device))
            x = torch.randint(50, (4, 8), device=device)
            print(f"training on {device}")

            def evaluate(model, batch):
                dev: str = "cuda:0"
                if dev.startswith("cuda") or dev in ("cuda", "mps"):
                    batch = batch.to(dev, non_blocking=True)
                return model(batch)
            """,
            """
            import os
            import torch

            device = 'xla'  # overridden by --device=...
            exec(open('configurator.py').read())
            if int(os.environ.get('LOCAL_RANK', -1)) >= 0:
                device = 'xla'
            accelerated = 'xla' in device and device != 'cpu'
            model.to(torch.device(device))
            x = torch.randint(50, (4, 8), device=device)
            print(f"training on {device}")

            def evaluate(model, batch):
                dev: str = "xla"
                if dev.startswith("xla") or dev in ("xla", "mps"):
                    batch = batch.to(dev, non_blocking=True)
                return model(batch)
            """,
            title="a stored device string read only as a device becomes 'xla', its device-type tests test for 'xla'",
        ),
        Example(
            """
            import torch

            device = "cuda"
            model = build(device)
            x = torch.zeros(3).to(device)
            """,
            None,
            title="a stored device string also passed on is reported where it is passed",
        ),
        Example(
            """
            import torch

            def get_device():
                if torch.cuda.is_available():
                    return "cuda"
                return "cpu"

            def default_device(rank):
                return f"cuda:{rank}" if torch.cuda.device_count() > 1 else "cuda"

            def main(model, rank):
                device = get_device()
                model.to(device)
                x = torch.zeros(3, device=default_device(rank))
                if get_device() == "cuda":
                    print("on", get_device())
                return model(x.to(device))
            """,
            """
            import torch

            def get_device():
                if torch.cuda.is_available():
                    return "xla"
                return "cpu"

            def default_device(rank):
                return "xla"

            def main(model, rank):
                device = get_device()
                model.to(device)
                x = torch.zeros(3, device=default_device(rank))
                if get_device() == "xla":
                    print("on", get_device())
                return model(x.to(device))
            """,
            title="a function of the file that returns device strings, each call used only as a device: 'xla'",
        ),
        Example(
            """
            import torch

            def get_device():
                return "cuda" if torch.cuda.is_available() else "cpu"

            def main(model):
                device = get_device()
                trainer = Trainer(model, device)
                return model.to(device)
            """,
            None,
            title="a device function whose value is also passed on is reported at its return",
        ),
        Example(
            """
            import torch

            def evaluate(model, batch, device):
                print("evaluating on", device)
                return model(batch.to(device))

            def train(model, batch, device):
                model.to(device)
                return evaluate(model, batch, device=device)

            def main(model, batch):
                device = "cuda"
                return train(model, batch, device)
            """,
            """
            import torch

            def evaluate(model, batch, device):
                print("evaluating on", device)
                return model(batch.to(device))

            def train(model, batch, device):
                model.to(device)
                return evaluate(model, batch, device=device)

            def main(model, batch):
                device = "xla"
                return train(model, batch, device)
            """,
            title="passed to functions of the file that read it only as a device: 'xla'",
        ),
        Example(
            """
            import torch

            def main(args, net):
                if args.cuda:
                    device = "cuda"
                elif args.mps:
                    device = "mps"
                else:
                    device = "cpu"
                device = torch.device(device)
                gpu = 0
                torch.cuda.set_device(gpu)
                return net.to(device), torch.zeros(3).to(gpu)
            """,
            """
            import torch

            def main(args, net):
                if args.cuda:
                    device = "xla"
                elif args.mps:
                    device = "mps"
                else:
                    device = "cpu"
                device = torch.device(device)
                gpu = "xla"
                torch.cuda.set_device(gpu)
                return net.to(device), torch.zeros(3).to(gpu)
            """,
            title="a device chosen among strings by the user's flags, and a CUDA device number kept in a variable",
        ),
        Example(
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument('--cuda', action='store_true', default=False, help='enables CUDA training')
            parser.add_argument('--mps', action='store_true', help='enables MPS training')
            args = parser.parse_args()
            if args.cuda and not args.mps:
                device = "cuda"
            elif args.mps and not args.cuda:
                device = "mps"
            else:
                device = "cpu"
            device = torch.device(device)
            model = torch.nn.Linear(2, 2).to(device)
            """,
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument('--cuda', action='store_true', default=False, help='enables CUDA training')
            parser.add_argument('--mps', action='store_true', help='enables MPS training')
            args = parser.parse_args()
            if args.cuda and not args.mps:
                device = "xla"
            elif args.mps and not args.cuda:
                device = "mps"
            else:
                device = "xla"
            device = torch.device(device)
            model = torch.nn.Linear(2, 2).to(device)
            """,
            title="opt-in accelerator flags: the default flags' CPU becomes 'xla' too",
        ),
        Example(
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument('--cuda', action='store_true', help='enables CUDA training')
            args = parser.parse_args()

            # choose the device
            if args.cuda:
                device = "cuda"
            else:
                device = "cpu"
            model = torch.nn.Linear(2, 2).to(device)
            """,
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument('--cuda', action='store_true', help='enables CUDA training')
            args = parser.parse_args()

            # choose the device
            device = "xla"
            model = torch.nn.Linear(2, 2).to(device)
            """,
            title="a CUDA/CPU choice by one opt-in flag becomes one assignment",
        ),
        Example(
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument('--cuda', action='store_true')
            parser.add_argument('--mps', action='store_true')
            args = parser.parse_args()
            if args.cuda:
                device = torch.device('cuda')
            elif args.mps:
                device = torch.device('mps')
            else:
                device = torch.device('cpu')
            model = torch.nn.Linear(2, 2).to(device)
            """,
            """
            import argparse
            import torch
            import torch_xla

            parser = argparse.ArgumentParser()
            parser.add_argument('--cuda', action='store_true')
            parser.add_argument('--mps', action='store_true')
            args = parser.parse_args()
            if args.cuda:
                device = torch.device('cuda')
            elif args.mps:
                device = torch.device('mps')
            else:
                device = torch_xla.device()
            model = torch.nn.Linear(2, 2).to(device)
            """,
            title="the same chain of torch.device objects: its default CPU becomes XLA's device",
        ),
    ]
    valid = [
        "import torch\nx = torch.zeros(3, device='cpu')\n",
        "import argparse\nimport torch\np = argparse.ArgumentParser()\np.add_argument('--mps', action='store_true')\n"
        "args = p.parse_args()\nif args.mps:\n    device = torch.device('mps')\nelse:\n    device = torch.device('cpu')\n",
        "import torch\ng = torch.Generator(device='cpu')\n",
        "import torch\nx = x.to(device)\n",
        "import torch\nx = x.to(torch.float16)\n",
        "import torch\nx = x.to(other)\n",
        "import torch\ndef f(x, n):\n    return x.to(n)\n",
        "import torch\nname = 'cuda_kernels'\n",
        "x = make(device='cuda')\n",  # not a torch file
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not imports_torch(self.ctx):
            return
        func = node.func
        name = self.ctx.qualname(func)
        is_method = isinstance(func, cst.Attribute) and func.attr.value in _METHODS and (name is None or not name.startswith("torch."))
        if is_method and func.attr.value == "to":  # type: ignore[union-attr]
            target = arg(node, "device", 0)
        elif is_method or (name is not None and name.startswith("torch.") and name not in ("torch.device", "torch.load")):
            target = arg(node, "device")
        else:
            target = None
            if name is None or not name.startswith("torch."):
                dev = arg(node, "device")
                if dev is not None and is_cuda_string(dev.value):
                    self.report(dev, "CUDA device string passed on: on XLA pass torch_xla.device() (check how the callee uses it)")
                default = arg(node, "default")
                if isinstance(func, cst.Attribute) and func.attr.value == "add_argument" and default is not None \
                        and is_cuda_string(default.value):
                    self._option_default(default.value)
            return
        if target is None:
            return
        if device_string_fact(self.ctx).get(target.value) == DEVICE_READ:
            return  # a device variable whose CUDA value is 'xla' in the port (_stored)
        ordinal = int_ordinal(target.value, self.ctx) if not is_cuda_string(target.value) else None
        if ordinal is not None:
            place = placement_expr(self.ctx)
            if isinstance(place, cst.Name) and isinstance(target.value, cst.Name) and place.value == target.value.value:
                # `device = 0; model.to(device)`: the script's device variable is the CUDA number itself
                place = cst.parse_expression(f"{self.ctx.module_alias(TORCH_XLA)}.device()")
            message = "an integer device is a CUDA device number: on XLA use the process's device (torch_xla.device())"
            if ordinal == SPELLING:
                message += "; the unsafe fix reads the name as a GPU number by its spelling"
            self.report(target.value, message, Fix((self.replace(target.value, place),),
                                                   Safety.SAFE if ordinal == PROVABLE else Safety.UNSAFE,
                                                   imports=() if isinstance(place, cst.Name) else (TORCH_XLA,)))
            return
        if not is_cuda_string(target.value):
            return
        if name == "torch.Generator":
            self.report(target.value, "torch.Generator(device='cuda'): XLA has no device generators (torch 2.9 / torch_xla 2.9: "
                                      "RuntimeError 'XLA device type not an accelerator'); use a CPU torch.Generator() and move "
                                      "the results, or seed the device with torch_xla.manual_seed()")
            return
        place = placement_expr(self.ctx)
        self.report(
            target.value,
            "CUDA device string: on XLA use torch_xla.device()",
            Fix((self.replace(target.value, place),), imports=() if isinstance(place, cst.Name) else (TORCH_XLA,)),
        )

    def _option_default(self, default: cst.BaseExpression) -> None:
        fix = (self.replace(default, xla_string(default)),)
        blocker = option_blocker(self.ctx, default, "xla")
        if blocker == "":
            self.report(default, "CUDA device string as a command-line default, and every read of the option is a "
                        "device use (torch.device(...), .to(...), device=, a device setup that accepts 'xla') or "
                        "text: on XLA the default is 'xla' (a device the user passes still applies)", Fix(fix))
            return
        reason = f" (not provable here: {blocker})" if blocker else ""
        self.report(default, "CUDA device string as a command-line default: the port runs with it unless the user "
                    "passes another device; on XLA default to 'xla' where every use of the option is a device use "
                    f"(torch.device(...), .to(...)), or pass --device xla{reason} (unsafe fix: the default becomes "
                    "'xla', and code that tests the option for 'cuda' or a library given the parsed arguments "
                    "reads that)", Fix(fix, Safety.UNSAFE))

    def visit_Assign(self, node: cst.Assign) -> None:
        self._stored(node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None and isinstance(node.target, cst.Name):
            self._stored(node.value)

    def _stored(self, value: cst.BaseExpression) -> None:
        if not imports_torch(self.ctx):
            return
        if isinstance(value, cst.Integer):
            if device_string_fact(self.ctx).get(value) == DEVICE_VALUE:
                self.report(value, "CUDA device number stored, used only as a device (torch.device, .to, device=): on "
                            "XLA the device is 'xla' (each XLA process owns its device)",
                            Fix((self.replace(value, xla_string(value)),)))
            return
        if not is_cuda_string(value):
            return
        if device_string_fact(self.ctx).get(value) == DEVICE_VALUE:
            self.report(value, "CUDA device string stored, used only as a device (torch.device, .to, device=, "
                        "device-type tests): on XLA it is 'xla' (a device the user passes still applies)",
                        Fix((self.replace(value, xla_string(value)),)))
            return
        self.report(value, "CUDA device string stored: on XLA the device is torch_xla.device() (call it where the "
                    "device is used); porter leaves it because the variable is also used as something else than "
                    "a device (TX103 reports that use)")

    def visit_Return(self, node: cst.Return) -> None:
        if not imports_torch(self.ctx):
            return
        leaves = returned(node.value)
        fact = device_string_fact(self.ctx)
        if isinstance(node.value, cst.IfExp) and all(
                v is not None and (fact.get(v) == DEVICE_VALUE or is_string(v, "xla")) for v in leaves):
            self.report(node.value, "CUDA device strings returned, and every call of the function is used only as a "
                        "device (torch.device, .to, device=, device-type tests): on XLA each is 'xla', one value",
                        Fix((self.replace(node.value, xla_string(leaves[0])),)))  # (not an if/else of equal arms)
            return
        for value in leaves:
            if value is None or not is_cuda_string(value):
                continue
            if device_string_fact(self.ctx).get(value) == DEVICE_VALUE:
                self.report(value, "CUDA device string returned, and every call of the function is used only as a "
                            "device (torch.device, .to, device=, device-type tests): on XLA it is 'xla'",
                            Fix((self.replace(value, xla_string(value)),)))
            else:
                self.report(value, "CUDA device string returned: on XLA the device is 'xla' (or torch_xla.device()); "
                            "porter leaves it because the function is also used in a way it cannot follow (a call "
                            "whose value is passed on or stored, or the function itself passed on): make it 'xla' "
                            "by hand")

    def visit_If(self, node: cst.If) -> None:
        """`if args.cuda: device = 'cuda' elif args.mps: device = 'mps' else: device = 'cpu'`
        (strings, or `torch.device(...)` of them): the `else` is what the script's default flags
        choose (every test is False with them); where the chain's CUDA device becomes XLA's, so
        does that default CPU."""
        if not imports_torch(self.ctx) or isinstance(self.ctx.parent, cst.If):
            return  # an `elif` is read with the chain it belongs to
        arms: list[tuple[cst.BaseExpression, cst.BaseExpression, str]] = []
        chain: cst.BaseSuite | cst.If | cst.Else | None = node
        while isinstance(chain, cst.If):
            assigned = self._assigned_device(chain.body)
            if assigned is None or default_truth(chain.test, self.ctx) is not False:
                return
            arms.append(assigned)
            chain = chain.orelse
        fallback = self._assigned_device(chain.body) if isinstance(chain, cst.Else) else None
        if fallback is None or fallback[2] != "cpu":
            return
        names = {code(target) for target, _, _ in arms}
        if names != {code(fallback[0])} or not any(kind == "cuda" for _, _, kind in arms):
            return
        message = ("the device the script's default flags choose (every test above is False with them): on a TPU "
                   "host the port trains on XLA by default, as the CUDA branch above does")
        xla = xla_string(fallback[1]) if isinstance(fallback[1], cst.SimpleString) else cst.parse_expression(
            f"{TORCH_XLA}.device()")
        imports = () if isinstance(fallback[1], cst.SimpleString) else (TORCH_XLA,)
        if all(kind == "cuda" for _, _, kind in arms):
            # every branch is XLA in the port: one assignment, not a test with identical arms
            one = node.orelse.body.body[0].with_changes(leading_lines=node.leading_lines)  # type: ignore[union-attr]

            def collapse(updated: cst.CSTNode) -> cst.CSTNode:
                line = one.deep_replace(one.body[0].value, xla)  # type: ignore[attr-defined]
                return line  # type: ignore[return-value]

            self.report(fallback[1], message, Fix((Edit(node, collapse),), imports=imports))
            return
        self.report(fallback[1], message + "; the other branches are kept as the user's flags choose them",
                    Fix((self.replace(fallback[1], xla),), imports=imports))

    def _assigned_device(self, body: cst.BaseSuite) -> "tuple[cst.BaseExpression, cst.BaseExpression, str] | None":
        """(target, value, "cuda" / "cpu" / "other") of a branch that assigns one device: a device
        string (`device = "cuda"`, a CUDA string counting where it is used as a device only),
        `torch.device(<string>)`, or XLA's device already (`torch_xla.device()`)."""
        assigned = _assigned_value(body)
        if assigned is None:
            return None
        target, value = assigned
        if isinstance(value, cst.SimpleString):
            if is_cuda_string(value):
                return target, value, "cuda" if device_string_fact(self.ctx).get(value) == DEVICE_VALUE else "other"
            return target, value, "cpu" if string_value(value) == "cpu" else "other"
        if not isinstance(value, cst.Call):
            return None
        q = self.ctx.qualname(value.func)
        if q in ("torch_xla.device", "torch_xla.core.xla_model.xla_device"):
            return target, value, "cuda"
        if q == "torch.device" and len(value.args) == 1 and isinstance(value.args[0].value, cst.SimpleString) \
                and value.args[0].keyword is None:
            string = value.args[0].value
            return target, value, "cuda" if is_cuda_string(string) else "cpu" if string_value(string) == "cpu" else "other"
        return None

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if device_string_fact(self.ctx).get(node) == DEVICE_TEST:
            self.report(node, "device-type test of a device string that is 'xla' on XLA: test for 'xla', so that the "
                        "port takes the accelerator path", Fix((self.replace(node, xla_string(node)),)))

    def visit_Name(self, node: cst.Name) -> None:
        if device_string_fact(self.ctx).get(node) == OTHER_USE:
            self.report(node, f"`{node.value}` holds a CUDA device string and is used here as something else than a "
                        "device (passed on, stored, returned): porter cannot tell what this code does with 'xla', so "
                        f"`{node.value}` stays 'cuda'; on XLA make it 'xla' (or torch_xla.device()) by hand")

    def visit_Param(self, node: cst.Param) -> None:
        if node.default is not None and is_cuda_string(node.default) and imports_torch(self.ctx):
            self.report(node.default, "CUDA default device: on XLA default to None and use torch_xla.device() in the body")


def _assigned_value(body: cst.BaseSuite) -> "tuple[cst.BaseExpression, cst.BaseExpression] | None":
    """(target, value) of a branch that is one assignment to a name: `device = <value>`."""
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    if len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine) or len(statements[0].body) != 1:
        return None
    stmt = statements[0].body[0]
    if isinstance(stmt, cst.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0].target, cst.Name):
        return stmt.targets[0].target, stmt.value
    return None
