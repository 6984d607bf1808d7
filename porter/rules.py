"""The rule model: what a rule reports, how a fix is described, and how rules are declared.

Everything here is plain data. A rule never edits text: it reports a :class:`Finding` on a
LibCST node, optionally with a :class:`Fix` made of node-level :class:`Edit` s and the imports
the new code needs. The engine (``porter.engine``) applies fixes, adds imports and re-checks.
"""
from __future__ import annotations

import enum
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, Optional, Sequence, Union

import libcst as cst

if TYPE_CHECKING:  # pragma: no cover
    from porter.context import FileContext


class Safety(str, enum.Enum):
    """How much a fix can be trusted without review (decided per fix, not per rule)."""

    SAFE = "safe"  # behaviour-preserving on XLA; applied by default
    UNSAFE = "unsafe"  # may change numerics or semantics; applied with --unsafe-fixes


class Severity(str, enum.Enum):
    ERROR = "error"  # the code will not run, or not correctly, on the target
    WARNING = "warning"  # runs, but slowly or with host syncs / recompilations
    INFO = "info"


Replacement = Union[
    cst.CSTNode,
    cst.RemovalSentinel,
    cst.FlattenSentinel,
    Callable[[cst.CSTNode], Union[cst.CSTNode, cst.RemovalSentinel, cst.FlattenSentinel]],
]


class NeedsHuman(Exception):
    """Raised by a rule (in a ``visit_``/``leave_`` method, or in a fix's callable replacement)
    when the code at hand cannot be ported automatically; the message says why, for the user.

    The engine turns it into a finding of the rule, without a fix, at the node being visited
    (or at the edit's target, from a replacement: that fix is then left out), and the rule
    goes on with the next node. Any other exception from a rule is a bug in porter: the
    engine reports it as that rule's internal error and leaves the rule's findings and fixes
    out for the file (the other rules' fixes still apply)."""


@dataclass(frozen=True)
class Edit:
    """Replace ``target`` (a node of the tree the rule saw) by ``replacement``.

    ``replacement`` may be a node, ``cst.RemoveFromParent()``, a ``cst.FlattenSentinel`` (to
    insert statements around a statement), or a callable that receives the node *after* the
    edits inside it were applied and returns its replacement. Callables compose with edits on
    descendants, so a rule that appends a statement to a loop body does not undo another
    rule's edit inside that body.
    """

    target: cst.CSTNode
    replacement: Replacement


@dataclass(frozen=True)
class Fix:
    edits: tuple[Edit, ...]
    safety: Safety = Safety.SAFE
    # Modules the new code refers to, by the local name the rule used (see
    # FileContext.module_alias). "torch_xla.core.xla_model" -> `import torch_xla.core.xla_model as xm`.
    imports: tuple[str, ...] = ()
    description: str = ""
    # Imports the fix may leave unused, as (module, name) pairs: ("torch.backends.cudnn", None)
    # stands for `import torch.backends.cudnn [as x]`, ("torch.cuda.amp", "GradScaler") for
    # `from torch.cuda.amp import GradScaler [as x]`. After the edits the engine removes each
    # one that nothing in the file uses any more (LibCST's RemoveImportsVisitor, scope
    # analysis); one still used, or not in the file, stays as it is.
    remove_imports: tuple[tuple[str, Optional[str]], ...] = ()


@dataclass(frozen=True)
class Position:
    line: int  # 1-based
    column: int  # 0-based, in code points
    end_line: int
    end_column: int


@dataclass
class Finding:
    code: str
    message: str
    node: cst.CSTNode
    severity: Severity
    fix: Optional[Fix] = None
    position: Optional[Position] = None
    # True for the engine's report of a rule's own exception (a bug in porter, not in the code
    # checked): see NeedsHuman
    internal_error: bool = False
    # True for a finding of a rule that reports what the other rules leave (Rule.yields_line):
    # dropped where another rule's finding covers the same line (engine.drop_yielding)
    yields: bool = False

    @property
    def fixable(self) -> bool:
        return self.fix is not None


@dataclass(frozen=True)
class Example:
    """A before/after pair. ``after`` None means: reported, no automatic fix."""

    before: str
    after: Optional[str] = None
    unsafe: bool = False  # the fix needs --unsafe-fixes
    title: str = ""

    def dedented(self) -> "Example":
        return Example(
            textwrap.dedent(self.before).lstrip("\n"),
            None if self.after is None else textwrap.dedent(self.after).lstrip("\n"),
            self.unsafe,
            self.title,
        )


class Rule:
    """Base class of every rule. One rule per file under ``codemods/<target>/``.

    Subclasses set the class attributes and define ``visit_<Node>`` / ``leave_<Node>`` methods
    (LibCST node class names) that call :meth:`report`. The class docstring is the rule's
    documentation (What it does / Why / Fix safety); ``examples`` generate its tests and docs.
    A new instance is made for every file, so instance state never leaks between files.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    target: ClassVar[str]  # "torch-xla", "jax", ...
    summary: ClassVar[str]  # one line, for `porter rules`
    severity: ClassVar[Severity] = Severity.WARNING
    default_enabled: ClassVar[bool] = True
    # Cheap pre-filter: the rule only runs on files whose text contains one of these words.
    needs_text: ClassVar[tuple[str, ...]] = ("torch",)
    # A gate on the document rather than on this pass's text: the rule runs only on documents
    # whose text where the run began (the text `porter check` reads; the text `porter migrate`
    # started from, for every fix pass) contains one of these words. For a front end's rules
    # (MXNet/Gluon -> PyTorch: ("mxnet",)): they run on Gluon documents only, also in the later
    # passes of a migrate, which read the PyTorch text the front end wrote. () = no gate.
    needs_document: ClassVar[tuple[str, ...]] = ()
    examples: ClassVar[Sequence[Example]] = ()
    valid: ClassVar[Sequence[str]] = ()  # code that must produce no finding
    # True: the rule's findings in a top-level statement depend only on that statement and
    # the file's imports, so `porter lsp` may check it one statement at a time and reuse its
    # findings for statements an edit did not touch (porter.incremental, which verifies the
    # claim on every run: a rule that reads the module, keeps state from one statement to
    # the next or reports on the module is run over the whole file for that version).
    # False (the default): always run over the whole file.
    # Not verified: state kept in ``ctx.cache`` from one statement to the next (each
    # statement's run gets a fresh cache): a rule that does so must not declare local.
    local: ClassVar[bool] = False
    # True: the rule reports what the other rules leave (GL901: MXNet code left in a port), and
    # its findings are dropped on a line where another rule's finding already stands, so that a
    # line is reported once (engine.drop_yielding, after every check and fix).
    yields_line: ClassVar[bool] = False

    def __init__(self, ctx: "FileContext") -> None:
        self.ctx = ctx
        self.findings: list[Finding] = []

    def report(
        self,
        node: cst.CSTNode,
        message: str,
        fix: Optional[Fix] = None,
        severity: Optional[Severity] = None,
    ) -> None:
        self.findings.append(
            Finding(self.code, message, node, severity or self.severity, fix, yields=self.yields_line)
        )

    # Convenience constructors -------------------------------------------------------
    @staticmethod
    def replace(target: cst.CSTNode, replacement: Replacement) -> Edit:
        return Edit(target, replacement)

    @staticmethod
    def remove(target: cst.CSTNode) -> Edit:
        return Edit(target, cst.RemoveFromParent())

    def remove_statement(self, node: cst.SimpleStatementLine) -> Edit:
        """Remove the statement line ``node`` (visited now); `pass` takes its place where it is
        the only statement of its block (the engine's settle drops an `if flag: pass` so left)."""
        parent = self.ctx.parent
        if isinstance(parent, cst.IndentedBlock) and len(parent.body) == 1:
            return self.replace(node, node.with_changes(body=[cst.Pass()]))
        return self.remove(node)

    @classmethod
    def doc(cls) -> str:
        return textwrap.dedent(cls.__doc__ or "").strip()


@dataclass(frozen=True)
class RuleInfo:
    """What the front ends need to know about a rule, without instantiating it."""

    code: str
    name: str
    target: str
    summary: str
    severity: Severity
    default_enabled: bool
    doc: str
    examples: tuple[Example, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, rule: type[Rule]) -> "RuleInfo":
        return cls(
            rule.code,
            rule.name,
            rule.target,
            rule.summary,
            rule.severity,
            rule.default_enabled,
            rule.doc(),
            tuple(e.dedented() for e in rule.examples),
        )


def module_fact(ctx: "FileContext", compute: Callable[["FileContext"], object]):
    """A fact of the whole module, ``compute(ctx)``, computed once per module and context:
    the analyses rule helpers share (the training-loop rules' index of assignments, the
    module's top-level classes and functions...). ``compute`` is a module-level function of
    the context that reads the module and the imports (not the ancestors: the walk may be
    anywhere when it is first asked for).

    A rule declared ``local`` may read module facts: when ``porter lsp`` checks it one
    top-level statement at a time (porter.incremental), the context supplies the fact of the
    whole current module and records each lookup the rule makes in it (a dictionary's
    ``get``/``[]``/``in``, a set's ``in``/``&``, a field's value; anything else of the fact
    makes the rule module-wide), and the statement's findings are reused while every recorded
    lookup gives the same answer in the new version (nodes compared by identity)."""
    provide = getattr(ctx, "provide_fact", None)
    if provide is not None:
        return provide(compute)
    return computed_module_fact(ctx, compute)


def computed_module_fact(ctx: "FileContext", compute: Callable[["FileContext"], object]):
    """``compute(ctx)``, cached in ``ctx.cache`` for the context's current module."""
    key = ("module_fact", compute)
    cached = ctx.cache.get(key)
    if cached is not None and cached[0] is ctx.module:
        return cached[1]
    value = compute(ctx)
    ctx.cache[key] = (ctx.module, value)
    return value


class StatementFact:
    """A module fact built statement by statement: ``part(ctx, stmt, pre)`` for each top-level
    statement in order (reading that statement and the imports only), then
    ``combine(ctx, parts, pre)``; ``pre`` is the value of another module fact (``pre_fact``,
    None without) that both receive, e.g. names declared anywhere in the module. Called as a
    function of the context, it computes the whole fact; `porter lsp` (porter.incremental)
    keeps each statement's part while the statement, the imports and ``pre`` are the same, so
    an edit costs the parts of the statements it changed and the combination."""

    def __init__(self, part: Callable, combine: Callable, pre_fact: Optional[Callable] = None, name: str = "") -> None:
        self.part = part
        self.combine = combine
        self.pre_fact = pre_fact
        self.__name__ = name or getattr(combine, "__name__", "statement_fact")

    def pre(self, ctx: "FileContext"):
        return None if self.pre_fact is None else module_fact(ctx, self.pre_fact)

    def __call__(self, ctx: "FileContext"):
        pre = self.pre(ctx)
        return self.combine(ctx, [self.part(ctx, stmt, pre) for stmt in ctx.module.body], pre)
