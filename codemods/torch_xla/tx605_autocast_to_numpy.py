from __future__ import annotations

from typing import Optional

import libcst as cst

from porter import astutil
from porter.rules import Example, Fix, Rule, Severity

_AUTOCAST = ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast", "torch.cuda.amp.autocast",
             "torch.cuda.amp.autocast_mode.autocast")
# methods between the value and .numpy() that keep its dtype
_KEEPING = ("detach", "cpu", "clone", "squeeze", "unsqueeze", "flatten", "view", "reshape", "contiguous")


class AutocastToNumpy(Rule):
    """
    ## What it does
    Inserts `.float()` before `.numpy()` on a model's output computed in an autocast region
    (`with torch.autocast(...): pred = model(x)`, then `pred.detach().cpu().numpy()`).

    ## Why
    On XLA the autocast computes in bfloat16 (TX601), and NumPy has no bfloat16:
    `.numpy()` raises "Got unsupported ScalarType BFloat16" where the CUDA original got a
    float16 array. A model's output under autocast is bfloat16 (a matmul's, a convolution's)
    or float32 (a softmax's): `.float()` keeps every value.

    ## Fix safety
    Safe: bfloat16 and float32 values are exact in float32; the NumPy array is float32 where the
    original's was float16, with the same values to float16's precision.
    """

    code = "TX605"
    local = True  # checked one top-level statement at a time where it keeps to it (porter.incremental)
    name = "autocast-to-numpy"
    target = "torch-xla"
    summary = "a model output computed under autocast (bfloat16 on XLA) -> .float() before .numpy()"
    severity = Severity.ERROR
    needs_text = ("autocast",)
    examples = [
        Example(
            """
            import torch

            with torch.autocast("xla", dtype=torch.bfloat16):
                pred = model(x)
            outs.append(pred.detach().cpu().numpy())
            """,
            """
            import torch

            with torch.autocast("xla", dtype=torch.bfloat16):
                pred = model(x)
            outs.append(pred.detach().cpu().float().numpy())
            """,
        ),
    ]
    valid = [
        "import torch\nwith torch.autocast('xla', dtype=torch.bfloat16):\n    idx = torch.argmax(out, 1)\nprint(idx.numpy())\n",
        "import torch\nwith torch.autocast('xla', dtype=torch.bfloat16):\n    pred = model(x)\nprint(pred.float().numpy())\n",
        "import torch\npred = model(x)\nprint(pred.numpy())\n",
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if astutil.method_name(node) != "numpy" or node.args:
            return
        receiver = node.func.value  # type: ignore[attr-defined]
        root = receiver
        while isinstance(root, (cst.Call, cst.Subscript)):
            if isinstance(root, cst.Call):
                if astutil.method_name(root) not in _KEEPING:
                    return  # .float(), .to(...), a function: its own dtype
                root = root.func.value  # type: ignore[attr-defined]
            else:
                root = root.value
        if not isinstance(root, cst.Name) or root.value not in self._model_outputs_under_autocast():
            return
        new = node.with_changes(func=node.func.with_changes(  # type: ignore[attr-defined]
            value=cst.Call(cst.Attribute(receiver, cst.Name("float")))))
        self.report(node, f"{root.value} is a model's output computed under autocast, bfloat16 on XLA, which NumPy "
                          "has no dtype for: .float() before .numpy()", Fix((self.replace(node, new),)))

    def _model_outputs_under_autocast(self) -> frozenset:
        """Names the current function (or the module) assigns from a model call inside an
        autocast `with` block."""
        fn = self.ctx.enclosing(cst.FunctionDef)
        scope: cst.CSTNode = fn.body if fn is not None else self.ctx.module
        key = ("tx605.outputs", id(scope))
        found: Optional[frozenset] = self.ctx.cache.get(key)
        if found is None:
            names: set[str] = set()
            for w in astutil.walk(scope):
                if isinstance(w, cst.With) and any(isinstance(i.item, cst.Call) and self.ctx.qualname(i.item.func)
                                                   in _AUTOCAST for i in w.items):
                    for a in astutil.walk(w.body):
                        if isinstance(a, cst.Assign) and isinstance(a.value, cst.Call) and self._model_call(a.value):
                            for t in a.targets:
                                names.update(astutil.target_names(t.target))
            found = self.ctx.cache[key] = frozenset(names)
        return found

    def _model_call(self, call: cst.Call) -> bool:
        """``model(x)``, ``self.net(x)``, ``model.forward(x)``: not a torch function, not a tensor
        method (``out.argmax(1)`` keeps its own dtype)."""
        func = call.func
        if self.ctx.qualname(func) is not None:
            return False
        return isinstance(func, cst.Name) or isinstance(func, cst.Attribute) and (
            astutil.root_name(func) == "self" or func.attr.value == "forward")
