from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.device_options import device_string, is_cuda_string, module_string_blocker, option_blocker, option_dest
from porter.rules import Example, Fix, Rule, Safety, Severity


class CudaDeviceFlag(Rule):
    """
    ## What it does
    Rewrites the CUDA default of a command-line option for the device
    (`parser.add_argument('--device', default='cuda')`, `'cuda:0'`, `f'cuda:{rank}'`, on a
    parser or an argument group, any option string or `dest=` that holds "device") to `'cpu'`.

    The fix is safe where every read of the option in the file is a torch device use
    (`torch.device(args.device)`, `.to(args.device)`, `device=args.device` in a torch call) or
    text, and the parsed namespace, followed from `parse_args()` through assignments, returns
    and the parameters of the file's functions, goes only to uses porter knows: a library's
    device setup that accepts any device type (timm's `utils.init_distributed_device(args)`),
    functions that read other options only, records (`yaml.safe_dump(vars(args))`,
    `wandb.init(config=args)`). It is the analysis TX103 makes for torch_xla's `'xla'`
    default. Otherwise (a device-type test `args.device == 'cuda'`, the namespace handed to
    code porter does not know, `choices=` without 'cpu') the fix is unsafe, and the finding
    quotes the first such read.

    The same for a script's module-level device string (`device = 'cuda'  # examples: 'cpu',
    'cuda', 'cuda:0'`, nanoGPT's configuration globals, which a config file or the command
    line may override): a name that says it is a device (`device`, `dev`, `*_device`), or
    whose reads include a device use, gets `'cpu'`; safe where every read of the global in the
    file (`torch.randint(..., device=device)`, `x.pin_memory().to(device, non_blocking=True)`,
    `torch.load(p, map_location=device)`) is a device use or text, unsafe with the first other
    read quoted (`on_gpu = device.startswith('cuda')`).

    A device type derived from the device (`device_type = 'cuda' if 'cuda' in device else
    'cpu'`, `... if str(device).startswith('cuda') ...`, `... if torch.device(d).type ==
    'cuda' ...`, `torch.device(d).type`, `d.split(':')[0]`) follows it: with the device 'cpu'
    it is 'cpu', as when the script's user passes a CPU device. Such a read is a device use
    where every read of the derived name is one too (a device use, text, the device type
    given to `torch.autocast` / `torch.amp.autocast` / `torch.amp.GradScaler`); a derived name
    that is tested (`if device_type == 'cuda':`) or handed on keeps the fix unsafe, with that
    read quoted.

    ## Why
    A JAX port has no CUDA device to name: JAX places arrays on its default device (the TPU
    on a TPU VM). Whatever still reads the flag runs as before: a library's device setup
    (`timm.utils.init_distributed_device(args)` asserts "CUDA is not available but cuda was
    specified"), `torch.device(args.device)` for the data code, an `if args.device ==
    'cuda'` branch. With the CUDA default the port fails before its first step on a machine
    without CUDA. The torch code that stays in a JAX port (the input pipeline, a library's
    setup) runs on the host: its device is the CPU.

    ## Fix safety
    Safe where every read is a device use, text, a use porter knows or a device type derived
    from it that is read only so: the torch code that
    stays places on the CPU what it placed on the GPU (JAX's arrays are not torch's), and a
    `--device` the user passes still applies. Unsafe where porter cannot follow a read: code
    that tests the option for 'cuda', or a function given the namespace, now sees 'cpu' and
    may take another path than the GPU's.
    """

    code = "JX312"
    local = True  # per statement in `porter lsp` (porter.incremental verifies it on every run)
    name = "jax-cuda-device-flag"
    target = "jax"
    summary = "add_argument('--device', default='cuda') / device = 'cuda' -> 'cpu' for the torch code that stays"
    severity = Severity.WARNING
    needs_text = ("add_argument", "cuda")
    examples = [
        Example(
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument('--device', default='cuda', type=str, help='device to train on')
            args = parser.parse_args()
            device = torch.device(args.device)
            print(f"training on {args.device}")
            """,
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument('--device', default='cpu', type=str, help='device to train on')
            args = parser.parse_args()
            device = torch.device(args.device)
            print(f"training on {args.device}")
            """,
            title="a device flag read only as a torch device",
        ),
        Example(
            """
            import argparse
            import torch
            from timm import utils

            parser = argparse.ArgumentParser()
            group = parser.add_argument_group("Device parameters")
            group.add_argument("--accel", dest="train_device", default="cuda:0")

            def main():
                args = parser.parse_args()
                device = utils.init_distributed_device(args)
                loader = build_loader(args)

            def build_loader(cfg):
                return torch.zeros(4).to(cfg.train_device)
            """,
            """
            import argparse
            import torch
            from timm import utils

            parser = argparse.ArgumentParser()
            group = parser.add_argument_group("Device parameters")
            group.add_argument("--accel", dest="train_device", default="cpu")

            def main():
                args = parser.parse_args()
                device = utils.init_distributed_device(args)
                loader = build_loader(args)

            def build_loader(cfg):
                return torch.zeros(4).to(cfg.train_device)
            """,
            title="an argument group, dest=, a library's device setup and a function of the file",
        ),
        Example(
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default=f"cuda:{0}")
            args = parser.parse_args()
            if args.device == "cuda:0":
                torch.backends.cudnn.benchmark = True
            """,
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="cpu")
            args = parser.parse_args()
            if args.device == "cuda:0":
                torch.backends.cudnn.benchmark = True
            """,
            unsafe=True,
            title="a flag that is also tested: an unsafe fix",
        ),
        Example(
            """
            import numpy as np
            import torch

            batch_size = 4
            device = 'cuda' # examples: 'cpu', 'cuda', 'cuda:0'
            exec(open('configurator.py').read())

            def get_batch(data):
                ix = torch.randint(len(data) - 8, (batch_size,))
                x = torch.stack([torch.from_numpy(data[i:i + 8].astype(np.int64)) for i in ix])
                return x.pin_memory().to(device, non_blocking=True)

            noise = torch.randn(batch_size, 8, device=device)
            print(f"running on {device}")
            """,
            """
            import numpy as np
            import torch

            batch_size = 4
            device = 'cpu' # examples: 'cpu', 'cuda', 'cuda:0'
            exec(open('configurator.py').read())

            def get_batch(data):
                ix = torch.randint(len(data) - 8, (batch_size,))
                x = torch.stack([torch.from_numpy(data[i:i + 8].astype(np.int64)) for i in ix])
                return x.pin_memory().to(device, non_blocking=True)

            noise = torch.randn(batch_size, 8, device=device)
            print(f"running on {device}")
            """,
            title="a module-level device string read only as a torch device",
        ),
        Example(
            """
            import torch

            train_device = "cuda:0"
            on_gpu = train_device.startswith("cuda")
            x = torch.zeros(3).to(train_device)
            """,
            """
            import torch

            train_device = "cpu"
            on_gpu = train_device.startswith("cuda")
            x = torch.zeros(3).to(train_device)
            """,
            unsafe=True,
            title="a module-level device string that is also tested: an unsafe fix",
        ),
        Example(
            """
            import argparse
            import torch

            device = 'cuda'
            device_type = 'cuda' if 'cuda' in device else 'cpu'
            ctx = torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)
            parser = argparse.ArgumentParser()
            parser.add_argument('--device', default='cuda:0')
            args = parser.parse_args()

            def main():
                kind = 'cpu' if not str(args.device).startswith('cuda') else 'cuda'
                amp_type = torch.device(args.device).type
                with torch.autocast(kind, dtype=torch.bfloat16):
                    y = torch.ones(2, device=args.device)
                scaler = torch.amp.GradScaler(amp_type)
            """,
            """
            import argparse
            import torch

            device = 'cpu'
            device_type = 'cuda' if 'cuda' in device else 'cpu'
            ctx = torch.amp.autocast(device_type=device_type, dtype=torch.bfloat16)
            parser = argparse.ArgumentParser()
            parser.add_argument('--device', default='cpu')
            args = parser.parse_args()

            def main():
                kind = 'cpu' if not str(args.device).startswith('cuda') else 'cuda'
                amp_type = torch.device(args.device).type
                with torch.autocast(kind, dtype=torch.bfloat16):
                    y = torch.ones(2, device=args.device)
                scaler = torch.amp.GradScaler(amp_type)
            """,
            title="a device type derived from the device (for torch.autocast) follows it to 'cpu'",
        ),
        Example(
            """
            import torch

            device = 'cuda'
            device_type = 'cuda' if 'cuda' in device else 'cpu'
            if device_type == 'cuda':
                torch.backends.cuda.matmul.allow_tf32 = True
            """,
            """
            import torch

            device = 'cpu'
            device_type = 'cuda' if 'cuda' in device else 'cpu'
            if device_type == 'cuda':
                torch.backends.cuda.matmul.allow_tf32 = True
            """,
            unsafe=True,
            title="a derived device type that is tested: unsafe, as a test of the device is",
        ),
    ]
    valid = [
        "import torch\nbackend = 'cuda'\nprint(backend)\n",
        "import torch\ndevice = 'cpu'\nx = torch.zeros(3, device=device)\n",
        "import torch\ndef f():\n    device = 'cuda'\n    return torch.zeros(3, device=device)\n",
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--device', default='cpu')\n",
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--name', default='cuda')\n",
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--device', default=None)\n",
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--device', default=pick())\n",
    ]

    def visit_Assign(self, node: cst.Assign) -> None:
        if not is_cuda_string(node.value) or len(self.ctx.ancestors) != 3:
            return  # (Module, SimpleStatementLine, Assign): a script's top level only
        found = module_string_blocker(self.ctx, node.value)
        if found is None:
            return
        name, blocker = found
        shown = astutil.code(node.value)
        fix = (self.replace(node.value, device_string("cpu", node.value)),)
        if blocker == "":
            self.report(node.value, f"{name} = {shown}: the JAX port has no CUDA device, and every read of {name} is a "
                                    "torch device use or text (or derives a device type that follows it): the torch code that stays runs on the host, so it is "
                                    "'cpu' (JAX places its arrays on its own default device; a value a config file "
                                    "or the command line sets still applies)", Fix(fix))
            return
        self.report(node.value, f"{name} = {shown}: the JAX port has no CUDA device, and torch code that still "
                                f"reads {name} asks for one (Found no NVIDIA driver); porter cannot show that every "
                                f"read is a device use (not provable here: {blocker}): the unsafe fix makes it 'cpu' "
                                "for the torch code that stays (code that tests it for 'cuda' then takes its CPU "
                                "path)", Fix(fix, Safety.UNSAFE))

    def visit_Call(self, node: cst.Call) -> None:
        if astutil.method_name(node) != "add_argument":
            return
        default = astutil.arg(node, "default")
        if default is None or not is_cuda_string(default.value):
            return
        names = [astutil.string_value(a.value) for a in node.args if a.keyword is None and not a.star]
        dest = option_dest(node)
        flags = [n for n in names if n is not None and n.startswith("-") and "device" in n.lower()]
        if not flags and not (dest is not None and "device" in dest.lower() and any(n and n.startswith("-") for n in names)):
            return
        flag = flags[0] if flags else next(n for n in names if n and n.startswith("-"))
        shown = astutil.code(default.value)
        fix = (self.replace(default.value, device_string("cpu", default.value)),)
        blocker = option_blocker(self.ctx, default.value, "cpu")
        if blocker == "":
            self.report(default, f"{flag} defaults to {shown}: the JAX port has no CUDA device, and every read of the "
                                 "option is a torch device use (torch.device(...), .to(...), device=, a device setup "
                                 "that accepts any device) or text: the torch code that stays runs on the host, so the "
                                 "default is 'cpu' (JAX places its arrays on its own default device; a device the user "
                                 "passes still applies)", Fix(fix))
            return
        reason = f" (not provable here: {blocker})" if blocker else ""
        self.report(default, f"{flag} defaults to {shown}: the JAX port has no CUDA device, and code that still reads the "
                             "flag (a library's device setup, torch.device(args.device)) fails with CUDA is not available "
                             f"but cuda was specified; porter cannot show that every read is a device use{reason}: the "
                             "unsafe fix defaults to 'cpu' for the torch code that stays (code that tests the option for "
                             "'cuda' then takes its CPU path); port what reads it by hand", Fix(fix, Safety.UNSAFE))
