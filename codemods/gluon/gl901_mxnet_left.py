from __future__ import annotations

from typing import Iterator

import libcst as cst

from porter import astutil
from porter.context import dotted_name
from porter.rules import Example, Rule, Severity

from . import _model

# what a file of the port imports once a Gluon rule's fix has translated some of it
_PORT_ROOTS = ("torch", "jax", "flax", "optax")
_BLOCKS = ("body", "orelse", "handlers", "finalbody")


class MxnetLeft(Rule):
    """
    ## What it does
    Runs on what the other Gluon rules leave (the findings porter reports are those of the
    last pass, once nothing else changes) and reports every statement of the port that still
    uses MXNet, once, at its line, naming the MXNet API that stays:

    - a name bound by an MXNet import and still used: an `mx.` / `nd.` / `mxnet.` attribute
      chain (`mx.image.imdecode(buf)`, `mx.recordio.unpack(s)`), a name of
      `from mxnet... import ...` (`numeric_types`, `autograd`, `gluon.data.Dataset`), also
      where it is only read (`isinstance(x, mx.nd.NDArray)`, a type hint);
    - `F` of a `hybrid_forward(self, F, ...)` that stays (an `F.<op>` the op table reports
      is marked by GL201; `F` passed on, `F.contrib.<op>`, are reported here);
    - the MXNet import that stays because of them (`import mxnet as mx`,
      `from mxnet.base import numeric_types`), with the names that keep it: the port fails
      there with `ModuleNotFoundError: No module named 'mxnet'` where MXNet is not installed,
      and the APIs that stay are given torch tensors (or JAX arrays) where MXNet made NDArrays.

    An import guarded by `try: ... except ImportError:` is not reported (it does not fail);
    its names are, where they are used. The rule reports in a migrate (whose findings are
    those of its last pass, when no rule has a fix left) and in a check of a file that is a
    port (it imports torch or jax, or carries a `# porter: manual` mark); a check of a Gluon
    file not ported yet leaves it to the other rules' findings, which say what to port. A
    line another rule already marked `# porter: manual` is not reported again, nor a line
    where a finding of another rule stands (`Rule.yields_line`).

    ## Why
    A port that keeps an MXNet import or call fails when it runs (often at the import, far
    from the line that needs a person); every line that keeps MXNet has to say so.

    ## Fix safety
    No fix: a report only.
    """

    code = "GL901"
    name = "mxnet-left"
    target = "torch"
    summary = "MXNet code left in the port after the other Gluon rules (mx.*, nd.*, names of mxnet imports, the import that stays): reported at its line"
    severity = Severity.ERROR
    needs_text = ("mxnet", "hybrid_forward")
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    yields_line = True
    examples = [
        Example(
            """
            import mxnet as mx
            import torch

            def load(buf):
                img = mx.image.imdecode(buf)
                return torch.as_tensor(img.asnumpy())
            """,
            None,
            title="an MXNet call no rule translates, and the import it keeps",
        ),
        Example(
            """
            import torch
            from mxnet import nd
            from mxnet.base import numeric_types

            def fill(x, value):
                if isinstance(value, numeric_types):
                    return torch.full_like(x, value)
                return nd.contrib.box_nms(value)  # porter: manual
            """,
            None,
            title="a name of a `from mxnet... import` still read; a line another rule marked is not reported again",
        ),
        Example(
            """
            import mxnet
            import jax.numpy as jnp

            def area(x: mxnet.nd.NDArray):
                return jnp.prod(jnp.asarray(x.shape))
            """,
            None,
            title="a type hint keeps the import of MXNet too",
        ),
    ]
    valid = [
        # a Gluon file no rule has ported yet: the other rules' findings speak
        "import mxnet as mx\nimg = mx.image.imdecode(buf)\n",
        # a port without MXNet left
        "import torch\nx = torch.zeros(3)\n",
        # a guarded import whose names are not used
        "import torch\ntry:\n    import mxnet as mx\nexcept ImportError:\n    mx = None\nx = torch.ones(2)\n",
        # `nd` of `self.nd` is an attribute, not the import's name
        "import torch\nfrom mxnet import nd  # porter: manual\n\nclass A:\n    def f(self):\n        return self.nd\n",
    ]

    def leave_Module(self, node: cst.Module) -> None:
        ctx = self.ctx
        if not (ctx.fixing or astutil.MANUAL in ctx.text or any(q.split(".")[0] in _PORT_ROOTS for q in ctx.aliases.values())):
            return  # a check of a Gluon file not ported yet: the other rules' findings say what to port
        users: dict[str, list[str]] = {}  # local name of an MXNet import -> the APIs that read it
        imports: list[tuple[cst.CSTNode, list[str]]] = []
        for stmt, guarded, shadow, fnames in _statements(node):
            marked = astutil.has_manual_marker(stmt)
            skip = _skip(stmt)
            uses: list[tuple[cst.CSTNode, str]] = []
            for n in _own_nodes(stmt):
                if isinstance(n, (cst.Import, cst.ImportFrom)):
                    names = _mxnet_import_names(n)
                    if names and not guarded and not marked:
                        imports.append((n, names))
                elif isinstance(n, (cst.Attribute, cst.Name)) and id(n) not in skip and _head(n) not in shadow:
                    qual = _f_qualname(n) if _head(n) in fnames else ctx.qualname(n) or ""
                    if qual == "mxnet" or qual.startswith("mxnet."):
                        uses.append((n, qual))
            kept = _longest(uses)
            for n, _ in kept:
                if _head(n) not in fnames:  # a hybrid_forward's F is no import's name
                    users.setdefault(_head(n), []).append(_model.code(n))
            if kept and not marked:
                apis = ", ".join(dict.fromkeys(_model.code(n) if _model.code(n) == q else f"{_model.code(n)} ({q})"
                                               for n, q in kept))
                self.report(kept[0][0], f"{apis}: MXNet left in the port (no rule translates it): this line still "
                                        "needs MXNet, and the port's values are torch tensors or JAX arrays, not "
                                        "NDArrays; port it by hand")
        for n, names in imports:
            apis = [a for local in names for a in users.get(local, [])]
            why = f"still used by {', '.join(dict.fromkeys(apis[:6]))}{' ...' if len(set(apis)) > 6 else ''}" if apis \
                else "left by the rules"
            self.report(n, f"{_model.code(n)}: the port still imports MXNet ({why}); it fails here with "
                           "ModuleNotFoundError where MXNet is not installed")


def _statements(module: cst.Module) -> Iterator[tuple[cst.CSTNode, bool, frozenset, frozenset]]:
    """Every simple statement line and compound statement of the module (functions and
    classes too), with whether it sits in a ``try`` that catches ImportError, the names the
    functions around it bind themselves (a parameter ``init`` is not MXNet's ``init``) and
    the ``F`` of a ``hybrid_forward(self, F, ...)`` around it (MXNet's nd or sym API)."""
    for st in module.body:
        yield from _statement_tree(st, False, frozenset(), frozenset())


def _statement_tree(st: cst.CSTNode, guarded: bool, shadow: frozenset,
                    fnames: frozenset) -> Iterator[tuple[cst.CSTNode, bool, frozenset, frozenset]]:
    yield st, guarded, shadow, fnames
    if not isinstance(st, cst.BaseCompoundStatement):
        return
    if isinstance(st, cst.FunctionDef):
        own = {n for imp in astutil.walk(st.body) if isinstance(imp, (cst.Import, cst.ImportFrom))
               for n in _mxnet_import_names(imp)}
        f = st.params.params[1].name.value if st.name.value == "hybrid_forward" and len(st.params.params) >= 2 else None
        shadow = shadow | frozenset(astutil.function_locals(st) - own - {f})
        fnames = (fnames - astutil.function_locals(st)) | ({f} if f else set())
    inner_guard = guarded or (isinstance(st, cst.Try) and any(_catches_import_error(h) for h in st.handlers))
    for part in _BLOCKS:
        p = getattr(st, part, None)
        if p is None:
            continue
        for x in (p if isinstance(p, (list, tuple)) else [p]):
            block = x if isinstance(x, cst.BaseSuite) else getattr(x, "body", None)
            if isinstance(x, cst.If):  # an elif
                yield from _statement_tree(x, guarded, shadow, fnames)
                continue
            if isinstance(x, cst.ExceptHandler):
                yield x, guarded, shadow, fnames  # its header (the exception types) is code too
            g = inner_guard if part == "body" else guarded
            if isinstance(block, cst.IndentedBlock):
                for s in block.body:
                    yield from _statement_tree(s, g, shadow, fnames)
            elif isinstance(block, cst.SimpleStatementSuite):
                yield block, g, shadow, fnames


def _catches_import_error(handler: cst.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
    names = [dotted_name(t.value if isinstance(t, cst.Element) else t) or "" for t in types]
    return any(n.split(".")[-1] in ("ImportError", "ModuleNotFoundError", "Exception", "BaseException") for n in names)


def _own_nodes(stmt: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The nodes of a statement itself: a simple statement (or a one-line suite) whole, a
    compound statement's header (test, iterable, with items, decorators, bases, the
    parameters' annotations and defaults, an except clause's types), not its body."""
    if isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        yield from astutil.walk(stmt, into_functions=True)
        return
    heads: list = []
    if isinstance(stmt, cst.FunctionDef):
        heads += [d for d in stmt.decorators] + [stmt.params] + ([stmt.returns] if stmt.returns else [])
    elif isinstance(stmt, cst.ClassDef):
        heads += [d for d in stmt.decorators] + list(stmt.bases) + list(stmt.keywords)
    elif isinstance(stmt, cst.ExceptHandler):
        heads += [stmt.type] if stmt.type is not None else []
    else:
        for part in ("test", "iter", "target", "items"):
            p = getattr(stmt, part, None)
            if p is not None:
                heads.extend(p if isinstance(p, (list, tuple)) else [p])
    for h in heads:
        yield from astutil.walk(h, into_functions=True)


def _skip(stmt: cst.CSTNode) -> set[int]:
    """Nodes of a statement that read no name of an import: attribute names (`self.nd`),
    keywords of arguments (`f(gluon=1)`), the names of imports, names bound by assignment
    (`mx = None`), parameters and definitions."""
    out: set[int] = set()
    for n in _own_nodes(stmt):
        if isinstance(n, cst.Attribute):
            out.add(id(n.attr))
        elif isinstance(n, cst.Arg) and n.keyword is not None:
            out.add(id(n.keyword))
        elif isinstance(n, (cst.Import, cst.ImportFrom)):
            out.update(id(m) for m in astutil.walk(n))
        elif isinstance(n, (cst.Param, cst.FunctionDef, cst.ClassDef)):
            out.add(id(n.name))
        elif isinstance(n, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor, cst.AsName)):
            target = n.target if not isinstance(n, cst.AsName) else n.name
            if isinstance(target, cst.Name):
                out.add(id(target))
            elif isinstance(target, (cst.Tuple, cst.List)):
                out.update(id(e.value) for e in target.elements if isinstance(e.value, cst.Name))
    return out


def _longest(uses: list[tuple[cst.CSTNode, str]]) -> list[tuple[cst.CSTNode, str]]:
    """The longest attribute chains only (`mx.image.imresize`, not also `mx.image` and `mx`)."""
    inner: set[int] = set()
    for n, _ in uses:
        if isinstance(n, cst.Attribute):
            inner.update(id(m) for m in astutil.walk(n.value))
    return [(n, q) for n, q in uses if id(n) not in inner]


def _f_qualname(node: cst.CSTNode) -> str:
    """``F.contrib.BilinearResize2D`` of a hybrid_forward's ``F`` -> "mxnet.ndarray.contrib.BilinearResize2D"."""
    return "mxnet.ndarray" + _model.code(node)[len(_head(node)):]


def _head(node: cst.CSTNode) -> str:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""


def _mxnet_import_names(imp: cst.CSTNode) -> list[str]:
    """The local names an import of MXNet binds (empty: not an import of MXNet)."""
    out = []
    if isinstance(imp, cst.Import):
        for a in imp.names:
            full = dotted_name(a.name) or ""
            if full == "mxnet" or full.startswith("mxnet."):
                out.append(dotted_name(a.asname.name) if a.asname else full.split(".")[0])
    elif isinstance(imp, cst.ImportFrom) and imp.module is not None and not imp.relative:
        mod = dotted_name(imp.module) or ""
        if mod == "mxnet" or mod.startswith("mxnet."):
            if isinstance(imp.names, cst.ImportStar):
                return ["*"]
            for a in imp.names:
                out.append(dotted_name(a.asname.name) if a.asname else dotted_name(a.name))
    return [n for n in out if n]
