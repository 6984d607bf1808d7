from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from porter import astutil
from porter.context import dotted_name, import_bindings
from porter.rules import Example, Fix, Rule, Severity

from . import _script as sc

# how a version is read without `X.__version__`: importlib.metadata.version("torch"),
# pkg_resources.get_distribution("mxnet").version
_DIST_VERSION_CALLS = ("importlib.metadata.version", "importlib_metadata.version")
_DIST_OBJECTS = ("pkg_resources.get_distribution", "importlib.metadata.distribution",
                 "importlib_metadata.distribution")
_IMPORT_CALLS = ("importlib.import_module", "builtins.__import__")
_COMPARISON_MODULES = frozenset({"distutils", "packaging", "pkg_resources", "looseversion", "importlib_metadata"})
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})
_WARN_CALLS = frozenset({"warn", "warning", "error", "critical", "print"})
_VERSION_TEXT = re.compile(r"^\d+(\.\d+)*([.\-+]?\w+)?$")
_PROBE_VERB = re.compile(r"require|check|assert|ensure|verify|validate|version")


def _framework(name: Optional[str]) -> Optional[str]:
    """"mxnet" / "torch" for a module or distribution name of either framework, else None."""
    if not name:
        return None
    head = name.split(".")[0].lower()
    if head == "mxnet" or head.startswith("mxnet-") or head.startswith("mxnet_"):
        return "mxnet"
    if head in ("torch", "pytorch"):
        return "torch"
    return None


def _catches_import_error(try_: cst.Try) -> bool:
    for handler in try_.handlers:
        if handler.type is None:
            return True
        kinds = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
        for kind in kinds:
            value = kind.value if isinstance(kind, cst.Element) else kind
            if (dotted_name(value) or "").split(".")[-1] in _IMPORT_ERRORS:
                return True
    return False


def _is_relative_import(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and bool(stmt.body)
            and all(isinstance(s, cst.ImportFrom) and s.relative for s in stmt.body))


def _one_line(node: cst.CSTNode) -> str:
    return re.sub(r"\\?\s+", " ", sc.code(node).strip())


def _block_statements(block: Optional[cst.CSTNode]) -> list[cst.CSTNode]:
    if block is None:
        return []
    body = getattr(block, "body", None)
    if isinstance(body, cst.IndentedBlock):
        return list(body.body)
    return list(body) if isinstance(body, (list, tuple)) else []


class GluonFrameworkProbe(Rule):
    """
    ## What it does
    Finds the checks a library makes of the framework it was written for, and ports them:

    - a version refusal (`if LooseVersion(torch.__version__) >= LooseVersion('2.0.0'): raise
      RuntimeError(...)`, also with `packaging.version.parse`, tuples of
      `__version__.split('.')`, `importlib.metadata.version("torch")`, the module got from
      `importlib.import_module`, `warnings.warn` instead of `raise`, `assert`): removed (its
      `else:` block kept, and the imports of LooseVersion / packaging.version it leaves unused
      removed). The bound of torch was written for the original's torch; the port
      runs on the target's (torch 2.9 for torch-xla; for JAX it is not the framework used);
      the bound of MXNet does not apply to a port that does not use MXNet.
    - a function that only probes MXNet (imports it, compares its version, raises): its body
      becomes `raise ImportError(...)`: the port does not use MXNet, so the probe answers as
      it does where MXNet is not installed, and callers that test for it
      (`try: _require_mxnet_version(...) except ImportError:`) take their no-MXNet path.
    - a call of such an MXNet probe outside a `try` that catches ImportError (the library
      required MXNet): removed.
    - the package's own imports (`from . import data, model_zoo`) inside a `try` that catches
      ImportError around an MXNet import or probe: moved after the `try`. In the original they
      load only when MXNet does; the port of those modules needs no MXNet, and an error in
      them must not be swallowed by the `except ImportError`.

    ## Why
    A library such as gluoncv probes its frameworks when it is imported
    (`_require_pytorch_version('1.4.0', '2.0.0')`): the ported package then refuses the torch
    it was ported to (RuntimeError at import), and its subpackages, imported in the same `try`
    as the MXNet probe, are silently not loaded.

    ## Fix safety
    Safe: only checks of a framework version go (a check that gates code, `if version >= (1,
    8): new_api()`, stays), and imports of the package's own modules are made unconditional.
    """

    code = "GL009"
    name = "gluon-framework-probe"
    target = "torch"
    summary = "framework version probes and probe-guarded imports -> no refusal of the port's framework"
    severity = Severity.ERROR
    needs_text = ("version", "ImportError")
    needs_document = ("mxnet",)  # Gluon documents only (see Rule.needs_document)
    examples = [
        Example(
            """
            import torch
            from distutils.version import LooseVersion

            if LooseVersion(torch.__version__) >= LooseVersion("2.0.0"):
                raise RuntimeError("torch<2.0.0 is required")
            import mxnet
            """,
            """
            import mxnet
            """,
            title="a torch bound that refuses the port's torch",
        ),
        Example(
            """
            import warnings
            import torch
            import mxnet as mx
            from packaging import version

            if version.parse(mx.__version__) < version.parse("1.6"):
                warnings.warn("mxnet>=1.6 is recommended")
            else:
                ready = True
            TORCH = tuple(int(x) for x in torch.__version__.split(".")[:2])
            assert TORCH >= (1, 4), "torch>=1.4 is required"
            if TORCH >= (1, 8):
                fast = True
            """,
            """
            import torch
            ready = True
            TORCH = tuple(int(x) for x in torch.__version__.split(".")[:2])
            if TORCH >= (1, 8):
                fast = True
            """,
            title="packaging.version, a version tuple, warnings.warn, assert; a check that gates code stays",
        ),
        Example(
            """
            def _require_mxnet_version(low, high="2.0.0"):
                \"\"\"Refuse an MXNet outside [low, high).\"\"\"
                try:
                    import mxnet as mx
                    from distutils.version import LooseVersion
                    if LooseVersion(mx.__version__) < LooseVersion(low) or \\
                            LooseVersion(mx.__version__) >= LooseVersion(high):
                        msg = "mxnet>={},<{} is required".format(low, high)
                        raise RuntimeError(msg)
                except ImportError as ex:
                    raise ImportError("Unable to import dependency mxnet") from ex


            def _require_pytorch_version(low, high="2.0.0"):
                try:
                    import torch
                    from distutils.version import LooseVersion
                    if LooseVersion(torch.__version__) < LooseVersion(low) or \\
                            LooseVersion(torch.__version__) >= LooseVersion(high):
                        raise RuntimeError("torch>={},<{} is required".format(low, high))
                except ImportError as ex:
                    raise ImportError("Unable to import dependency pytorch") from ex
            """,
            """
            def _require_mxnet_version(low, high="2.0.0"):
                \"\"\"Refuse an MXNet outside [low, high).\"\"\"
                raise ImportError("_require_mxnet_version: this port does not use MXNet; MXNet counts as not installed")


            def _require_pytorch_version(low, high="2.0.0"):
                try:
                    import torch
                except ImportError as ex:
                    raise ImportError("Unable to import dependency pytorch") from ex
            """,
            title="probe functions (gluoncv's check.py)",
        ),
        Example(
            """
            from .check import _require_mxnet_version, require_torch

            _found_mxnet = False
            try:
                _require_mxnet_version("1.4.0", "2.0.0")
                from . import data
                from . import model_zoo, nn
                _found_mxnet = True
            except ImportError:
                pass
            require_torch("1.4.0")
            """,
            """
            from .check import _require_mxnet_version, require_torch

            _found_mxnet = False
            try:
                _require_mxnet_version("1.4.0", "2.0.0")
                _found_mxnet = True
            except ImportError:
                pass
            from . import data
            from . import model_zoo, nn
            require_torch("1.4.0")
            """,
            title="the subpackages imported in the try of the MXNet probe (gluoncv's __init__.py)",
        ),
        Example(
            """
            import importlib
            from importlib.metadata import version

            from .base import check_mxnet

            check_mxnet("1.6.0")
            try:
                import mxnet
                from .gluon_parts import Block
            except ModuleNotFoundError:
                Block = None
            if version("mxnet-cu110") < "1.6":
                raise ImportError("mxnet>=1.6 is required")
            tv = importlib.import_module("torch")
            major, minor = tv.__version__.split(".")[:2]
            if (int(major), int(minor)) > (1, 13):
                raise ImportError("torch<2 is required")
            """,
            """
            import importlib

            from .base import check_mxnet
            try:
                import mxnet
            except ModuleNotFoundError:
                Block = None
            from .gluon_parts import Block
            tv = importlib.import_module("torch")
            major, minor = tv.__version__.split(".")[:2]
            """,
            title="an unguarded MXNet probe call, a direct import, importlib.metadata, import_module",
        ),
    ]
    valid = [
        # a version check that gates code, not a refusal
        "import mxnet as mx\nfrom packaging import version\nif version.parse(mx.__version__) >= version.parse('1.6'):\n"
        "    use_np = True\n",
        # a refusal of something else than a framework version
        "import mxnet as mx\nimport sys\nif sys.version_info < (3, 6):\n    raise RuntimeError('python>=3.6')\n",
        # a try around an optional dependency that is not a framework
        "import mxnet as mx\ntry:\n    import cv2\n    from . import image\nexcept ImportError:\n    cv2 = None\n",
        # a probe call inside a try that catches ImportError stays
        "import mxnet\nfrom .check import require_mxnet_version\ntry:\n    require_mxnet_version('1.4')\nexcept ImportError:\n"
        "    pass\n",
        # the version only printed
        "import mxnet as mx\nprint('mxnet', mx.__version__)\n",
    ]

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._replaced: set[int] = set()  # probe functions whose whole body is replaced

    # --- facts -----------------------------------------------------------------------
    def _scope_of(self) -> cst.CSTNode:
        for anc in reversed(self.ctx.ancestors[:-1]):
            if isinstance(anc, cst.FunctionDef):
                return anc
        return self.ctx.module

    def _facts(self, scope: cst.CSTNode) -> tuple[dict[str, str], dict[str, str]]:
        """(local name -> what it is bound to by an import, name -> framework whose version it
        holds) in ``scope`` (a function or the module), the module's imports included."""
        key = ("gl009.facts", scope)
        if key in self.ctx.cache:
            return self.ctx.cache[key]
        aliases = dict(self.ctx.aliases)
        if scope is not self.ctx.module:
            outer = self._facts(self.ctx.module)
            aliases.update(outer[0])
        nodes = list(astutil.walk(scope.body if isinstance(scope, cst.FunctionDef) else scope))
        sources = self.ctx.cache.setdefault(("gl009.sources", scope), {})
        for n in nodes:
            if isinstance(n, (cst.Import, cst.ImportFrom)):
                for b in import_bindings(n):
                    aliases[b.local] = b.bound
                    sources[b.local] = (b.imported, None) if isinstance(n, cst.Import) else tuple(b.imported.rsplit(".", 1))
        versions: dict[str, str] = {} if scope is self.ctx.module else dict(self._facts(self.ctx.module)[1])
        assigns = [n for n in nodes if isinstance(n, (cst.Assign, cst.AnnAssign)) and n.value is not None]
        for n in assigns:  # `mx = importlib.import_module("mxnet")`
            call = n.value
            if isinstance(call, cst.Call) and self._resolve(call.func, aliases) in _IMPORT_CALLS and call.args:
                fw = _framework(astutil.string_value(call.args[0].value))
                if fw:
                    for t in (n.targets if isinstance(n, cst.Assign) else [n]):
                        for name in astutil.target_names(t.target):
                            aliases[name] = fw
        for _ in range(2):  # `v = torch.__version__` then `major = int(v.split(".")[0])`
            for n in assigns:
                fws = self._reads_version(n.value, aliases, versions)
                if fws:
                    for t in (n.targets if isinstance(n, cst.Assign) else [n]):
                        for name in astutil.target_names(t.target):
                            versions[name] = sorted(fws)[0]
        self.ctx.cache[key] = (aliases, versions)
        return aliases, versions

    @staticmethod
    def _resolve(node: cst.CSTNode, aliases: dict[str, str]) -> Optional[str]:
        dotted = dotted_name(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head == "__import__" and not rest:
            return "builtins.__import__"
        full = aliases.get(head)
        if full is None:
            return None
        return f"{full}.{rest}" if rest else full

    def _reads_version(self, expr: cst.CSTNode, aliases: dict[str, str], versions: dict[str, str]) -> set[str]:
        """The frameworks whose version ``expr`` reads."""
        found: set[str] = set()
        for n in astutil.walk(expr):
            if isinstance(n, cst.Attribute) and n.attr.value in ("__version__", "version"):
                if n.attr.value == "__version__":
                    fw = _framework(self._resolve(n.value, aliases))
                else:  # pkg_resources.get_distribution("mxnet").version
                    call = n.value
                    fw = None
                    if isinstance(call, cst.Call) and call.args and self._resolve(call.func, aliases) in _DIST_OBJECTS:
                        fw = _framework(astutil.string_value(call.args[0].value))
                if fw:
                    found.add(fw)
            elif isinstance(n, cst.Call) and n.args and self._resolve(n.func, aliases) in _DIST_VERSION_CALLS:
                fw = _framework(astutil.string_value(n.args[0].value))
                if fw:
                    found.add(fw)
            elif isinstance(n, cst.Name) and n.value in versions:
                found.add(versions[n.value])
        return found

    def _versions_in(self, expr: cst.CSTNode) -> set[str]:
        aliases, versions = self._facts(self._scope_of())
        return self._reads_version(expr, aliases, versions)

    def _comparison_imports(self, node: cst.CSTNode) -> tuple:
        """The imports of version-comparison helpers (LooseVersion, packaging.version, ...) that
        ``node`` reads: the engine removes those left unused (distutils is gone in Python 3.12)."""
        scope = self._scope_of()
        self._facts(scope)
        sources = {**self.ctx.cache.get(("gl009.sources", self.ctx.module), {}),
                   **self.ctx.cache.get(("gl009.sources", scope), {})}
        out = []
        for n in astutil.walk(node):
            pair = sources.get(n.value) if isinstance(n, cst.Name) else None
            if pair and pair[0].split(".")[0] in _COMPARISON_MODULES and pair not in out:
                out.append(pair)
        return tuple(out)

    def _inside_replaced(self) -> bool:
        return any(id(a) in self._replaced for a in self.ctx.ancestors[:-1])

    # --- what a probe looks like -----------------------------------------------------
    @staticmethod
    def _refuses(block: cst.CSTNode) -> bool:
        """A block that only builds a message and raises or warns."""
        stmts = _block_statements(block)
        refused = False
        for stmt in stmts:
            if not isinstance(stmt, cst.SimpleStatementLine):
                return False
            for small in stmt.body:
                if isinstance(small, cst.Raise):
                    refused = True
                elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                    name = dotted_name(small.value.func) or ""
                    if name.split(".")[-1] not in _WARN_CALLS:
                        return False
                    refused = refused or name.split(".")[-1] != "print"
                elif not isinstance(small, (cst.Assign, cst.AnnAssign, cst.Pass, cst.Expr)):
                    return False
        return refused

    def _probe_only(self, stmts, aliases, versions) -> bool:
        """Statements that only import, compare a framework version, build messages and raise."""
        for stmt in stmts:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Return) and small.value is not None and \
                            not (isinstance(small.value, cst.Name) and small.value.value == "None"):
                        return False
                    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                        if (dotted_name(small.value.func) or "").split(".")[-1] not in _WARN_CALLS:
                            return False
                    elif not isinstance(small, (cst.Import, cst.ImportFrom, cst.Assign, cst.AnnAssign, cst.Pass,
                                                cst.Raise, cst.Return, cst.Expr, cst.Assert)):
                        return False
            elif isinstance(stmt, cst.If):
                if not self._reads_version(stmt.test, aliases, versions):
                    return False
                if not self._probe_only(_block_statements(stmt), aliases, versions):
                    return False
                if stmt.orelse is not None and not self._probe_only([stmt.orelse] if isinstance(stmt.orelse, cst.If)
                                                                    else _block_statements(stmt.orelse),
                                                                    aliases, versions):
                    return False
            elif isinstance(stmt, cst.Try):
                blocks = [stmt, *stmt.handlers, stmt.orelse, stmt.finalbody]
                if not all(self._probe_only(_block_statements(b), aliases, versions) for b in blocks):
                    return False
            else:
                return False
        return True

    def _mxnet_probes(self) -> dict[str, cst.FunctionDef]:
        """This file's functions that only probe MXNet's version (by name)."""
        key = ("gl009.probes", self.ctx.module)
        if key not in self.ctx.cache:
            found = {}
            for fn in astutil.walk(self.ctx.module, into_functions=True):
                if not isinstance(fn, cst.FunctionDef):
                    continue
                aliases, versions = self._facts(fn)
                read = set()
                for n in astutil.walk(fn.body):
                    if isinstance(n, (cst.If, cst.Assert)):
                        read |= self._reads_version(n.test, aliases, versions)
                if read == {"mxnet"} and self._probe_only(_block_statements(fn), aliases, versions):
                    found[fn.name.value] = fn
            self.ctx.cache[key] = found
        return self.ctx.cache[key]

    def _is_mxnet_probe_call(self, call: cst.Call) -> bool:
        name = dotted_name(call.func)
        if name is None:
            return False
        if name in self._mxnet_probes():
            return True
        last = name.split(".")[-1].lower()
        if not ("mxnet" in last or re.search(r"(^|_)mx(_|$)", last)) or not _PROBE_VERB.search(last):
            return False
        values = [astutil.string_value(a.value) for a in call.args]
        return all(v is not None and _VERSION_TEXT.match(v) for v in values)

    def _guarded(self) -> bool:
        """Inside the body of a `try` (of this function) that catches ImportError."""
        ancestors = self.ctx.ancestors[:-1]
        for i in range(len(ancestors) - 1, -1, -1):
            anc = ancestors[i]
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return False
            if isinstance(anc, cst.Try) and i + 1 < len(ancestors) and ancestors[i + 1] is anc.body:
                if _catches_import_error(anc):
                    return True
        return False

    # --- edits -----------------------------------------------------------------------
    def _drop(self, stmt: cst.CSTNode, keep: Optional[list] = None):
        """Remove ``stmt`` (or put ``keep``, statements, in its place), leaving no empty block."""
        parent = None
        for i, anc in enumerate(self.ctx.ancestors):
            if anc is stmt and i > 0:
                parent = self.ctx.ancestors[i - 1]
        if keep:
            return self.replace(stmt, cst.FlattenSentinel(keep))
        siblings = parent.body if isinstance(parent, (cst.IndentedBlock, cst.Module)) else ()
        if len(siblings) == 1 and isinstance(parent, cst.IndentedBlock):
            return self.replace(stmt, cst.SimpleStatementLine([cst.Pass()]))
        return self.remove(stmt)

    @staticmethod
    def _frameworks_text(fws: set[str]) -> str:
        parts = []
        if "torch" in fws:
            parts.append("torch's bound was written for the original's torch, and the port runs on the target's")
        if "mxnet" in fws:
            parts.append("the port does not use MXNet")
        return "; ".join(parts)

    # --- visits ----------------------------------------------------------------------
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if self._inside_replaced() or self._mxnet_probes().get(node.name.value) is not node:
            return
        self._replaced.add(id(node))
        name = node.name.value
        stmts = _block_statements(node)
        doc = stmts[:1] if stmts and isinstance(stmts[0], cst.SimpleStatementLine) and \
            isinstance(stmts[0].body[0], cst.Expr) and isinstance(stmts[0].body[0].value, cst.BaseString) else []
        raise_ = astutil.statement(
            f'raise ImportError("{name}: this port does not use MXNet; MXNet counts as not installed")\n')

        def apply(updated: cst.FunctionDef) -> cst.FunctionDef:
            return updated.with_changes(body=updated.body.with_changes(body=[*doc, raise_]))

        self.report(node, f"{name}() probes MXNet's version: the port does not use MXNet, so the probe raises "
                          "ImportError, as where MXNet is not installed", Fix((self.replace(node, apply),)))

    def visit_If(self, node: cst.If) -> None:
        if self._inside_replaced() or not self._refuses(node):
            return
        fws = self._versions_in(node.test)
        if not fws:
            return
        test = _one_line(node.test)
        if isinstance(self.ctx.parent, cst.If) or isinstance(node.orelse, cst.If):
            astutil.report_manual(self, node, f"a framework version check in an elif chain (`{test}`): "
                                              f"{self._frameworks_text(fws)}; remove the refusal by hand")
            return
        keep = _block_statements(node.orelse) if isinstance(node.orelse, cst.Else) else None
        self.report(node, f"framework version check `{test}` refuses: {self._frameworks_text(fws)}; removed",
                    Fix((self._drop(node, keep),), remove_imports=self._comparison_imports(node.test)))

    def visit_Assert(self, node: cst.Assert) -> None:
        if self._inside_replaced():
            return
        fws = self._versions_in(node.test)
        stmt = astutil.enclosing_simple_statement(self.ctx)
        if not fws or stmt is None:
            return
        edit = self._drop(stmt) if len(stmt.body) == 1 else self.remove(node)
        self.report(node, f"framework version assert `{_one_line(node.test)}`: "
                          f"{self._frameworks_text(fws)}; removed",
                    Fix((edit,), remove_imports=self._comparison_imports(node.test)))

    def visit_Expr(self, node: cst.Expr) -> None:
        call = node.value
        if self._inside_replaced() or not isinstance(call, cst.Call) or not self._is_mxnet_probe_call(call):
            return
        if self._guarded():
            return
        stmt = astutil.enclosing_simple_statement(self.ctx)
        if stmt is None:
            return
        edit = self._drop(stmt) if len(stmt.body) == 1 else self.remove(node)
        self.report(node, f"{sc.code(call.func)}(...) requires MXNet: the port does not use MXNet; removed",
                    Fix((edit,)))

    def visit_Try(self, node: cst.Try) -> None:
        if self._inside_replaced() or not _catches_import_error(node):
            return
        body = _block_statements(node)
        if not any(_is_relative_import(s) for s in body) or not any(self._probes_mxnet(s) for s in body):
            return
        moved = [s for s in body if _is_relative_import(s)]
        names = ", ".join(sc.code(s).strip() for s in moved)

        def apply(updated: cst.Try):
            stmts = list(updated.body.body)
            imports = [s for s in stmts if _is_relative_import(s)]
            rest = [s for s in stmts if not _is_relative_import(s)] or [cst.SimpleStatementLine([cst.Pass()])]
            imports = [s.with_changes(leading_lines=()) for s in imports]
            return cst.FlattenSentinel([updated.with_changes(body=updated.body.with_changes(body=rest)), *imports])

        self.report(node, f"the package's own imports ({names}) sit in the try of an MXNet probe: the port loads "
                          "them without MXNet; moved after the try, so that an error in them is not swallowed",
                    Fix((self.replace(node, apply),)))

    def _probes_mxnet(self, stmt: cst.CSTNode) -> bool:
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        for small in stmt.body:
            if isinstance(small, cst.Import) and any(_framework(dotted_name(a.name)) == "mxnet" for a in small.names):
                return True
            if isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None and \
                    _framework(dotted_name(small.module)) == "mxnet":
                return True
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and \
                    self._is_mxnet_probe_call(small.value):
                return True
        return False
