import libcst as cst

from porter.astutil import string_value
from porter.rules import Example, Rule, Severity

from ._tables import DEPRECATED_ENV


class DeprecatedEnvVars(Rule):
    """
    ## What it does
    Reports environment variables that torch_xla 2.9 no longer honours or is phasing out:
    `XLA_USE_BF16`, `XLA_DOWNCAST_BF16`, `XLA_USE_FP16`, `XLA_DOWNCAST_FP16`, `XLA_USE_SPMD`,
    the XRT runtime's `XRT_TPU_CONFIG` / `XRT_WORKERS` / `XRT_DEVICE_MAP`, XLA:CUDA's
    `GPU_NUM_DEVICES`, and `PJRT_DEVICE` set to `'CUDA'`/`'GPU'`, wherever their name is
    written as a string (`os.environ[...] = ...`, `os.environ.get(...)`, `setdefault`, a
    launcher's `env` dict).

    ## Why
    Checked in torch_xla 2.9.0: the native library still reads `XLA_USE_BF16`, with the
    message "XLA_USE_BF16 will be deprecated after the 2.6 release, please convert your model
    to bf16 directly"; `import torch_xla` warns that `XLA_USE_FP16` / `XLA_DOWNCAST_FP16` are
    deprecated (removed per pytorch/xla#8915); `xr.use_spmd()` warns "XLA_USE_SPMD is being
    deprecated". XRT was removed in 2.2 and XLA:CUDA in 2.9. The replacements change code
    elsewhere (an autocast region or a dtype conversion of the model, `xr.use_spmd()` at
    start-up), so the finding says what to use and a person applies it.
    """

    code = "TX004"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "xla-deprecated-env-vars"
    target = "torch-xla"
    summary = "report XLA_USE_BF16 / XLA_DOWNCAST_BF16 / XLA_USE_SPMD / XRT_* / XLA:CUDA environment variables"
    severity = Severity.WARNING
    needs_text = tuple(DEPRECATED_ENV) + ("PJRT_DEVICE",)
    examples = [
        Example(
            """
            import os

            os.environ["XLA_USE_BF16"] = "1"
            os.environ["PJRT_DEVICE"] = "CUDA"
            """,
            None,
        ),
    ]
    valid = [
        "import os\nos.environ['PJRT_DEVICE'] = 'TPU'\n",
        "print('set XLA_USE_BF16=1 to ...')\n",
    ]

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value in DEPRECATED_ENV:
            self.report(node, DEPRECATED_ENV[value])

    def visit_Assign(self, node: cst.Assign) -> None:
        value = string_value(node.value)
        if value not in ("CUDA", "GPU"):
            return
        for t in node.targets:
            target = t.target
            if isinstance(target, cst.Subscript) and len(target.slice) == 1:
                index = target.slice[0].slice
                if isinstance(index, cst.Index) and string_value(index.value) == "PJRT_DEVICE":
                    self.report(node, "PJRT_DEVICE=CUDA: XLA:CUDA was removed from torch_xla 2.9; use PJRT_DEVICE=TPU (or CPU)",
                                severity=Severity.ERROR)
