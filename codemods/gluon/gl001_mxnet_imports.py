from __future__ import annotations

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc


class UnusedMxnetImport(Rule):
    """
    ## What it does
    Removes an import of MXNet (`import mxnet as mx`, `from mxnet import autograd, gluon, nd`,
    `from mxnet.gluon import nn`, ...) once nothing in the file refers to the name it binds:
    the other Gluon rules translate the references, this rule drops the import when the last
    one is gone. A name that is still used (a construct no rule translates) keeps its import,
    so the port fails loudly at that construct instead of at an unrelated `NameError`.

    ## Why
    The port must run without MXNet installed.

    ## Fix safety
    Safe: only names that nothing in the file reads are removed.
    """

    code = "GL001"
    name = "gluon-unused-mxnet-import"
    target = "torch"
    summary = "remove MXNet imports that no code of the file refers to any more"
    severity = Severity.ERROR
    needs_text = sc.NEEDS_MXNET
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import mxnet as mx
            from mxnet import autograd, gluon
            import torch

            x = torch.ones(2)
            with autograd.record():
                y = x * 2
            """,
            """
            from mxnet import autograd
            import torch

            x = torch.ones(2)
            with autograd.record():
                y = x * 2
            """,
            title="mx and gluon are no longer used; autograd still is",
        ),
    ]
    valid = [
        "import mxnet as mx\nctx = mx.cpu()\n",
        "from mxnet.gluon import nn\nnet = nn.Dense(2)\n",
    ]

    def visit_Module(self, node: cst.Module) -> None:
        used = self._used(node)
        for stmt in astutil.walk(node, into_functions=True):
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    self._check(stmt, small, [(a, dotted_name(a.name)) for a in small.names], used)
                elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
                    mod = dotted_name(small.module) or ""
                    if isinstance(small.names, cst.ImportStar):
                        continue
                    self._check(stmt, small, [(a, f"{mod}.{dotted_name(a.name)}") for a in small.names], used)

    def _check(self, stmt, small, aliases, used) -> None:
        drop = []
        for alias, full in aliases:
            if not full or not (full == "mxnet" or full.startswith("mxnet.")):
                continue
            if alias.asname is not None:
                local = dotted_name(alias.asname.name)
            else:
                local = (dotted_name(alias.name) or "").split(".")[0] if isinstance(small, cst.Import) else dotted_name(alias.name)
            if local and local not in used:
                drop.append(alias)
        if not drop:
            return
        keep = [a for a in small.names if a not in drop]
        if keep:
            keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            edit = self.replace(small, small.with_changes(names=keep))
        elif len(stmt.body) == 1:
            edit = self.remove(stmt)
        else:
            edit = self.remove(small)
        names = ", ".join(sc.code(a.name) for a in drop)
        self.report(small, f"MXNet import no longer used: {names}", Fix((edit,)))

    @staticmethod
    def _used(module: cst.Module) -> set[str]:
        """Names read anywhere outside import statements (the heads of attribute chains too)."""
        return {n.value for n in _walk_skipping_imports(module) if isinstance(n, cst.Name)}


def _walk_skipping_imports(node: cst.CSTNode):
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, (cst.Import, cst.ImportFrom)):
            continue
        yield current
        if isinstance(current, cst.Attribute):  # `x.gluon` does not read a name `gluon`
            stack.append(current.value)
        elif isinstance(current, cst.Arg):  # nor does the keyword of `f(gluon=1)`
            stack.append(current.value)
        else:
            stack.extend(reversed(astutil.children(current)))
