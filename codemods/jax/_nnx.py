"""Shared facts and code builders of the module rules (JX001-JX099): which classes of a file
are modules, the ``rngs`` threading, the emitted helper classes and weight converter (rendered
from templates/jax_layers.py.j2 and templates/jax_weights.py.j2), and the ``# porter: manual``
marker.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Optional

import jinja2
import libcst as cst

from porter import astutil, emitted
from porter.astutil import NOT_LITERAL as NOT_LITERAL
from porter.astutil import code as code
from porter.astutil import has_kwarg as has_kwarg
from porter.astutil import has_param as has_param
from porter.astutil import kwarg as kwarg
from porter._layout import templates_dir
from porter.context import FileContext, dotted_name
from porter.rules import Edit, module_fact

from . import _program


MANUAL = astutil.MANUAL
TORCH_MODULE = ("torch.nn.Module", "torch.nn.modules.module.Module")
# torch containers a module class may derive from -> the port's base (emitted by JX011)
# torch layers a module class may derive from (its own forward reading the layer's attributes,
# `self.weight`, `self.eps`) -> the emitted NNX class keeping torch's attributes and names
TORCH_LAYER_BASES = {"torch.nn.LayerNorm": "TorchLayerNormBase", "torch.nn.modules.normalization.LayerNorm": "TorchLayerNormBase"}
TORCH_CONTAINER_BASES = {"torch.nn.Sequential": "TorchSequential", "torch.nn.modules.container.Sequential": "TorchSequential",
                         "torch.nn.ModuleDict": "TorchModuleDict", "torch.nn.modules.container.ModuleDict": "TorchModuleDict",
                         "torch.nn.ModuleList": "TorchModuleList", "torch.nn.modules.container.ModuleList": "TorchModuleList",
                         **TORCH_LAYER_BASES}
NNX_MODULE = "flax.nnx.Module"
literal = astutil.python_literal  # the NNX rules read any literal ast.literal_eval reads (dicts, sets too)


def nnx_name(ctx: FileContext) -> str:
    return ctx.module_alias("flax.nnx")


# --------------------------------------------------------------------------------------
# Module classes of a file
# --------------------------------------------------------------------------------------
def module_classes(ctx: FileContext) -> dict[str, cst.ClassDef]:
    """Top-level classes deriving from torch.nn.Module or nnx.Module, directly or through
    other such classes of the file (in file order), by name. A module fact
    (porter.rules.module_fact): `porter lsp` may check its readers one statement at a time."""
    return module_fact(ctx, _module_classes_of)


def _module_classes_of(ctx: FileContext) -> dict[str, cst.ClassDef]:
    found: dict[str, cst.ClassDef] = {}
    changed = True
    classes = [s for s in ctx.module.body if isinstance(s, cst.ClassDef)]
    imported = _program.rngs_callables(ctx) if classes else frozenset()
    while changed:
        changed = False
        for cls in classes:
            if cls.name.value in found:
                continue
            for base in cls.bases:
                q = ctx.qualname(base.value)
                name = dotted_name(base.value)
                if q in TORCH_MODULE or q in TORCH_CONTAINER_BASES or q == NNX_MODULE or (name in found) or (name in imported):
                    found[cls.name.value] = cls
                    changed = True
                    break
    return {c.name.value: c for c in classes if c.name.value in found}


def direct_base(cls: cst.ClassDef, ctx: FileContext) -> Optional[str]:
    """"torch" when the class derives from torch.nn.Module itself, "nnx" for nnx.Module,
    "file" for another module class of the file, else None."""
    for base in cls.bases:
        q = ctx.qualname(base.value)
        if q in TORCH_MODULE or q in TORCH_CONTAINER_BASES:
            return "torch"
        if q == NNX_MODULE:
            return "nnx"
        if dotted_name(base.value) in module_classes(ctx) or dotted_name(base.value) in _program.rngs_callables(ctx):
            return "file"  # a module class of the file, or of another module of the program
    return None


def enclosing_module_class(ctx: FileContext) -> Optional[cst.ClassDef]:
    """The top-level module class around the current node, if any."""
    for anc in ctx.ancestors[:-1]:
        if isinstance(anc, cst.ClassDef):
            return anc if module_classes(ctx).get(anc.name.value) is anc else None
    return None


def _one_module_param(func: cst.FunctionDef, skip: int) -> bool:
    """``func`` takes one positional parameter after ``skip`` leading ones (``self``), and maybe a
    keyword-only ``rngs``."""
    p = func.params
    return len(p.params) == skip + 1 and not p.posonly_params and p.star_kwarg is None \
        and not isinstance(p.star_arg, cst.Param) and all(q.name.value == "rngs" for q in p.kwonly_params)


def _static(func: cst.FunctionDef) -> bool:
    return any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in func.decorators)


def apply_init_target(ctx: FileContext, fn: cst.CSTNode) -> Optional[cst.FunctionDef]:
    """The function ``model.apply(fn)`` calls on every submodule, when porter can see it: a
    module-level def of the file taking the module, or (``fn`` is ``self.name``, inside a module
    class) a method of that class taking ``(self, module)`` or a staticmethod taking ``(module)``."""
    if isinstance(fn, cst.Name):
        for stmt in ctx.module.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == fn.value and _one_module_param(stmt, 0):
                return stmt
        return None
    if not (isinstance(fn, cst.Attribute) and isinstance(fn.value, cst.Name) and fn.value.value == "self"):
        return None
    cls = enclosing_module_class(ctx)
    if cls is None:
        return None
    for stmt in cls.body.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == fn.attr.value:
            return stmt if _one_module_param(stmt, 0 if _static(stmt) else 1) else None
    return None


# --------------------------------------------------------------------------------------
# Calls and arguments
# --------------------------------------------------------------------------------------
def with_arg(call: cst.Call, arg: cst.Arg) -> cst.Call:
    """``call`` with one more argument at the end (keeping a multi-line call's layout)."""
    args = list(call.args)
    if args:
        last = args[-1]
        comma = last.comma
        if comma is cst.MaybeSentinel.DEFAULT or comma is None:
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            return call.with_changes(args=[*args, arg])
        # a trailing comma (a multi-line call): the new argument goes on its own line, like the others
        args.append(arg.with_changes(comma=comma))
        args[-2] = last.with_changes(comma=_comma_like(args[-3].comma if len(args) > 2 else comma))
        return call.with_changes(args=args)
    return call.with_changes(args=[arg])


def _comma_like(comma):
    return comma if isinstance(comma, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def with_rngs(call: cst.Call) -> cst.Call:
    if has_kwarg(call, "rngs"):
        return call
    return with_arg(call, kwarg("rngs", cst.Name("rngs")))


# --------------------------------------------------------------------------------------
# The `# porter: manual` marker
# --------------------------------------------------------------------------------------
def statement_of(ctx: FileContext) -> Optional[cst.CSTNode]:
    """The simple statement line holding the current node, or the compound statement (for, if,
    while, with) in whose header it sits: where its ``# porter: manual`` comment goes."""
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, cst.SimpleStatementLine):
            return anc
        if isinstance(anc, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            return None
        if isinstance(anc, cst.BaseCompoundStatement):
            return anc if isinstance(getattr(anc, "body", None), cst.IndentedBlock) else None
    return None


has_manual_marker = astutil.has_manual_marker  # (a compound statement's header line counts)
manual_comment = astutil.manual_comment  # manual_comment(code, reason): `# porter: manual (CODE): reason`


# --------------------------------------------------------------------------------------
# Emitted code (helpers and the weight converter), rendered from templates/
# --------------------------------------------------------------------------------------
_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(templates_dir())), keep_trailing_newline=True,
    autoescape=False, trim_blocks=True, lstrip_blocks=True,
)


_RENDERED: dict[tuple, tuple[cst.BaseStatement, ...]] = {}


def render(template: str, **values) -> list[cst.BaseStatement]:
    """The template's statements with ``values``; parsed once per process when the values are
    hashable (the nodes are immutable, and every use puts them into a new tree)."""
    key: Optional[tuple] = (template, tuple(sorted(values.items())))
    try:
        statements = _RENDERED.get(key)  # type: ignore[arg-type]
    except TypeError:  # a set or list among the values: rendered each time
        key, statements = None, None
    if statements is None:
        statements = tuple(cst.parse_module(_ENV.get_template(template).render(**values)).body)
        emitted.record(statements)
        if key is not None:
            _RENDERED[key] = statements
    return list(statements)


def insert_statements(statements: list[cst.BaseStatement], where: str, used_by: frozenset = frozenset()):
    """An Edit replacement for the Module: ``statements`` inserted before the first top-level
    class or function definition ("before_defs"), or after the last module class / before an
    ``if __name__ == "__main__":`` block ("after_classes"). ``used_by``: the texts of callees
    (``torch.optim.SGD``) whose top-level calls need the statements defined: where such a
    call runs before that place (a script training at module level), the statements go
    after the file's imports instead. The comments above the statement that follows stay
    with it."""

    def apply(module: cst.Module) -> cst.Module:
        body = list(module.body)
        at = _insertion_index(body, where)
        if used_by and any(_calls_any(stmt, used_by) for stmt in body[:at]):
            at = next((i for i, stmt in enumerate(body) if not _is_head(stmt)), len(body))
        at = min(at, _first_use(body[:at], statements))
        new = list(statements)
        if at < len(body):
            body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *_from_comment(body[at].leading_lines)])
        if new and at > 0:
            new[0] = new[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        return module.with_changes(body=_hoisted([*body[:at], *new, *body[at:]]))

    return apply


def _runs(body: list, names: Iterable[str] = ()) -> Iterator[tuple[int, set]]:
    """(index, the names it runs) for each top-level statement of ``body`` that runs code (no
    definition or import): the file's top-level functions and classes (and ``names``) it
    uses, directly or through those functions and classes."""
    defs = {stmt.name.value: stmt for stmt in body if isinstance(stmt, (cst.FunctionDef, cst.ClassDef))}
    vocabulary = set(defs) | set(names)
    refs = {id(stmt): names_used(stmt, vocabulary) for stmt in body if not _is_head(stmt)}
    for i, stmt in enumerate(body):
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or _is_head(stmt) or not refs[id(stmt)]:
            continue
        seen: set = set()
        todo = list(refs[id(stmt)])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                if name in defs:
                    todo.extend(refs[id(defs[name])] - seen)
        yield i, seen


def _first_use(body: list, statements: list) -> int:
    """The index of the first top-level statement of ``body`` that runs a name the
    ``statements`` define, directly or through the file's functions and classes (``netA.apply(
    weights_init)`` between two classes, where ``weights_init`` calls an emitted ``init_normal_``);
    ``len(body)`` when none does."""
    defined = {stmt.name.value for stmt in statements if isinstance(stmt, (cst.FunctionDef, cst.ClassDef))}
    if not defined:
        return len(body)
    return next((i for i, reached in _runs(body, defined) if reached & defined), len(body))


def _hoisted(body: list) -> list:
    """``body`` with each top-level function moved up to just before the first statement that
    runs it, where that statement comes first: an emitted helper another block of helpers calls
    (``init_torch_param_`` calls ``_torch_layout``, placed after the last class) is defined
    before module-level code runs it. Moving a definition up changes nothing else: its names
    resolve when it is called."""
    if not any(isinstance(stmt, cst.FunctionDef) for stmt in body):
        return list(body)
    runs = [(body[i], reached) for i, reached in _runs(body)]
    body = list(body)
    for stmt, reached in runs:  # in program order: each moves what it runs above itself
        at = next(i for i, s in enumerate(body) if s is stmt)
        late = [s for s in body[at + 1:] if isinstance(s, cst.FunctionDef) and s.name.value in reached]
        if not late:
            continue
        body = [s for s in body if not any(s is m for m in late)]
        at = next(i for i, s in enumerate(body) if s is stmt)
        body[at:at] = [m.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]) for m in late]
    return body


def _from_comment(lines) -> list:
    """The leading lines from the first comment on (the blank lines before it go)."""
    lines = list(lines)
    for i, line in enumerate(lines):
        if line.comment is not None:
            return lines[i:]
    return []


def _calls_any(stmt: cst.CSTNode, callees: frozenset) -> bool:
    """A call of one of ``callees`` (by its text) in a top-level statement, outside defs."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return False
    return any(isinstance(n, cst.Call) and cst.Module([]).code_for_node(n.func) in callees for n in astutil.walk(stmt))


def _insertion_index(body: list, where: str) -> int:
    if where == "before_defs":
        for i, stmt in enumerate(body):
            if isinstance(stmt, (cst.ClassDef, cst.FunctionDef)):
                return i
        for i, stmt in enumerate(body):
            if not _is_head(stmt):
                return i
        return len(body)
    last = None
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.ClassDef):
            last = i
    if last is not None:
        return last + 1
    for i, stmt in enumerate(body):
        if _is_main_guard(stmt):
            return i
    return len(body)


def _is_head(stmt) -> bool:
    if isinstance(stmt, cst.SimpleStatementLine):
        return all(
            isinstance(s, (cst.Import, cst.ImportFrom))
            or (isinstance(s, cst.Expr) and isinstance(s.value, (cst.SimpleString, cst.ConcatenatedString)))
            for s in stmt.body
        )
    return False


def _is_main_guard(stmt) -> bool:
    return isinstance(stmt, cst.If) and "__name__" in code(stmt.test)


def module_names_used(ctx: FileContext, wanted: Iterable[str]) -> set[str]:
    """``names_used(ctx.module, wanted)``, from one walk of the module per context (a module fact)
    for every rule that asks."""
    return set(module_fact(ctx, _module_names) & frozenset(wanted))


def _module_names(ctx: FileContext) -> frozenset:
    """Every name (``cst.Name``) of the module, in functions and classes too."""
    name = cst.Name
    return frozenset(n.value for n in astutil.walk(ctx.module, into_functions=True) if type(n) is name)


def names_used(node: cst.CSTNode, wanted: Iterable[str]) -> set[str]:
    wanted = set(wanted)
    name = cst.Name  # (the exact type: isinstance against LibCST's classes goes through ABCMeta)
    return {n.value for n in astutil.walk(node, into_functions=True) if type(n) is name and n.value in wanted}


# --------------------------------------------------------------------------------------
# Where `rngs` flows: functions that build modules, and the calls that get rngs=rngs
# --------------------------------------------------------------------------------------
class RngsPlan:
    """Per file: the functions that take ``*, rngs: nnx.Rngs`` (the __init__ of every module
    class, methods and top-level factory functions that build layers or modules), and the
    calls inside them that pass ``rngs=rngs`` on."""

    def __init__(self, ctx: FileContext) -> None:
        from . import _layers  # circular at import time

        self.ctx = ctx
        self._assign_cache: dict[cst.FunctionDef, list] = {}
        self.classes = module_classes(ctx)
        # constructors of the program's other modules that take rngs once ported
        self.imported = _program.rngs_callables(ctx)
        self.functions: dict[cst.FunctionDef, Optional[cst.ClassDef]] = {}
        top_functions = {s.name.value: s for s in ctx.module.body if isinstance(s, cst.FunctionDef)}
        for cls in self.classes.values():
            if root_kind(cls, ctx) != "torch":
                continue  # an NNX module already: only what builds layers below
            for stmt in cls.body.body:
                if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "__init__":
                    self.functions[stmt] = cls
        # fixed point: methods and factories that construct something taking rngs
        body_calls: dict[cst.FunctionDef, list] = {}  # each round asks again of the same bodies
        returning = [f for f in top_functions.values() if _returns(f)]  # (the same every round)
        changed = True
        while changed:
            changed = False
            candidates: list = [(f, None) for f in returning]
            for cls in self.classes.values():
                candidates += [(s, cls) for s in cls.body.body if isinstance(s, cst.FunctionDef)]
            for func, cls in candidates:
                if func in self.functions:
                    continue
                if func.name.value == "forward" or func.name.value == "__call__":
                    continue
                calls = body_calls.get(func)
                if calls is None:
                    calls = body_calls[func] = list(astutil.calls_in(func.body))
                if any(self.call_needs_rngs(c, func, cls, _layers) for c in calls):
                    self.functions[func] = cls
                    changed = True

    def call_needs_rngs(self, call: cst.Call, func: cst.FunctionDef, cls: Optional[cst.ClassDef], _layers=None) -> bool:
        """The call builds a layer or module that takes rngs (inside ``func``)."""
        if _layers is None:
            from . import _layers
        if has_kwarg(call, "rngs"):
            return True
        qual = self.ctx.qualname(call.func)
        if qual in RANDOM_INITS or (isinstance(call.func, cst.Name) and call.func.value in RANDOM_HELPERS):
            return True  # torch.nn.init drawing random numbers: from the caller's rngs
        if qual and (qual.startswith("torch.nn.") or qual in _layers.LIBRARY_LAYERS):
            layer = _layers.layer_of(qual)
            if layer is not None and layer.rngs:
                return True
            return False
        return self.passes_rngs(call, func, cls)

    def passes_rngs(self, call: cst.Call, func: cst.FunctionDef, cls: Optional[cst.ClassDef]) -> bool:
        """A call of the file that should get rngs=rngs: a module class, a factory function,
        a method of the class that builds modules, super().__init__ of a subclass of a module
        class of the file, or a parameter annotated as a module class (``block: Type[BasicBlock]``)."""
        f = call.func
        if any(a.star == "**" and _own_kwargs(a.value, func) for a in call.args) \
                and not (func in self.functions or has_param(func, "rngs")):
            return False  # **kwargs passed on carry rngs (a factory's own callers give it)
        # (a function with its own rngs parameter took rngs out of its **kwargs: it passes it on)
        if dotted_name(f) in self.imported and not (isinstance(f, cst.Name) and f.value in self.classes):
            return True  # a class or factory of another module of the program (`Stem(...)`, `L.Stem(...)`)
        if ported_library_call(f, self.ctx):
            return True  # library model code ported with the program (`torchvision.models.resnet18()`)
        if isinstance(f, cst.Name):
            if f.value in self.classes:
                return self.class_takes_rngs(self.classes[f.value])
            if cls is not None and _is_cls_param(f.value, func):
                return self.class_takes_rngs(cls)  # `cls(config)` in a classmethod of a module class
            if any(g.name.value == f.value and c is None for g, c in self.functions.items()):
                return True
            return self._module_parameter(f.value, func) or self.layer_factory(f.value, func, cls)
        if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == "self" and cls is not None:
            name = f.attr.value
            return any(g.name.value == name and c is cls for g, c in self.functions.items())
        if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value in self.classes:
            return f.attr.value in self.class_methods().get(f.value.value, ())  # `GPT.from_pretrained(...)`
        if isinstance(f, cst.Attribute) and f.attr.value in self.factory_attributes():
            return True  # a module class held by a value (`cnf.block(cnf, ...)`, `cfg.norm_layer(c)`)
        if isinstance(f, cst.Subscript) and isinstance(f.value, cst.Name) and self._factory_sequence(f.value.value, func):
            return True  # an element of a sequence of module classes (`blocks[0](c, ...)`)
        if (
            isinstance(f, cst.Attribute) and f.attr.value == "__init__" and isinstance(f.value, cst.Call)
            and isinstance(f.value.func, cst.Name) and f.value.func.value == "super"
            and cls is not None and (direct_base(cls, self.ctx) == "file" or any(
                self.ctx.qualname(b.value) in TORCH_LAYER_BASES for b in cls.bases))
        ):
            return True  # the base's __init__ takes rngs (a class of the file, an emitted layer base)
        return False

    def class_methods(self) -> dict[str, frozenset]:
        """Class name -> its classmethods and staticmethods that take rngs once ported (they
        build a model: ``GPT.from_pretrained(...)`` constructing ``GPT(config)`` or ``cls(config)``),
        the class's own or inherited from a class of the file. A call through the class
        (``Net.build(...)``) passes rngs to them."""
        own: dict[str, set] = {}
        for func, cls in self.functions.items():
            if cls is not None and any(_decorator_name(d) in ("classmethod", "staticmethod") for d in func.decorators):
                own.setdefault(cls.name.value, set()).add(func.name.value)
        out: dict[str, frozenset] = {}
        for name, cls in self.classes.items():
            names, seen, todo = set(), set(), [cls]
            while todo:
                c = todo.pop()
                if c.name.value in seen:
                    continue
                seen.add(c.name.value)
                names |= own.get(c.name.value, set())
                todo += [self.classes[b] for b in (dotted_name(x.value) for x in c.bases) if b in self.classes]
            if names:
                out[name] = frozenset(names)
        return out

    def factory_attributes(self) -> frozenset:
        """Attribute names that hold a module class or a layer factory wherever the file's
        classes declare them: a field annotated as one (``block: Callable[..., nn.Module]``,
        ``block: Type[Bottleneck]``, a dataclass's or a plain class's), or set in an ``__init__``
        from one (``self.block = MBConv``, ``self.norm = norm_layer`` with ``norm_layer=nn.BatchNorm2d``).
        A call of such an attribute of another object (``cnf.block(cnf, sd_prob)``) builds a
        module that takes rngs."""
        found = getattr(self, "_factory_attributes", None)
        if found is not None:
            return found
        names: set = set()
        for cls in (s for s in self.ctx.module.body if isinstance(s, cst.ClassDef)):
            for stmt in cls.body.body:
                for small in (stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ()):
                    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) \
                            and self._module_annotation(small.annotation.annotation):
                        names.add(small.target.value)
                if not (isinstance(stmt, cst.FunctionDef) and stmt.name.value == "__init__"):
                    continue
                for node in astutil.walk(stmt.body):
                    if isinstance(node, cst.AnnAssign):
                        targets, value = [node.target], node.value
                        if self._module_annotation(node.annotation.annotation) and _self_attr(node.target):
                            names.add(node.target.attr.value)
                    elif isinstance(node, cst.Assign):
                        targets, value = [t.target for t in node.targets], node.value
                    else:
                        continue
                    if value is None:
                        continue
                    held = self._layer_value(value) or (isinstance(value, cst.Name) and (
                        self.layer_factory(value.value, stmt, cls, 1) or self._module_parameter(value.value, stmt)))
                    if held:
                        names.update(t.attr.value for t in targets if _self_attr(t))
        self._factory_attributes = frozenset(names)
        return self._factory_attributes

    def _module_annotation(self, annotation: cst.BaseExpression) -> bool:
        """``Callable[..., nn.Module]`` or an annotation naming a module class of the file."""
        text = code(annotation)
        if "Callable" in text and "Module" in text:
            return True
        mentioned = {n.value for n in astutil.walk(annotation, into_functions=True) if isinstance(n, cst.Name)}
        return bool(mentioned & set(self.classes))

    def class_takes_rngs(self, cls: cst.ClassDef, seen=None) -> bool:
        """A torch module class (its __init__ gets rngs), or an NNX one whose __init__, its own
        or inherited from the file, has an rngs parameter (the emitted pooling classes do not)."""
        if root_kind(cls, self.ctx) == "torch":
            return True
        from . import _layers  # circular at import time

        if cls.name.value in _layers.TAKES_RNGS:
            return False  # an emitted pooling class: rngs accepted (for layer factories), not needed
        seen = seen or set()
        seen.add(cls.name.value)
        for stmt in cls.body.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "__init__":
                return has_param(stmt, "rngs") or stmt in self.functions
        for base in cls.bases:
            name = dotted_name(base.value)
            if name in self.classes and name not in seen:
                return self.class_takes_rngs(self.classes[name], seen)
        return False

    def _module_parameter(self, name: str, func: cst.FunctionDef, seen=None) -> bool:
        """``name`` is a parameter of ``func`` that holds a module class of the file: annotated
        as one (``block: Type[BasicBlock]``), or, unannotated, given a module class (or such a
        parameter of the caller) at every call of ``func`` in the file (``ResNet(BasicBlock, ...)``
        -> ``self._make_layer(block, ...)`` -> ``block(...)``)."""
        params = [*func.params.posonly_params, *func.params.params, *func.params.kwonly_params]
        param = next((p for p in params if p.name.value == name), None)
        if param is None:
            return False
        if param.annotation is not None:
            mentioned = {n.value for n in astutil.walk(param.annotation.annotation, into_functions=True) if isinstance(n, cst.Name)}
            return bool(mentioned & set(self.classes))
        seen = set() if seen is None else seen
        if (id(func), name) in seen:
            return True  # a cycle: decided by the other call sites
        seen.add((id(func), name))
        sites = self._call_sites(func)
        if not sites:
            return False
        positional = [*func.params.posonly_params, *func.params.params]
        if self._owner(func) is not None and positional:
            positional = positional[1:]  # self
        index = next((i for i, p in enumerate(positional) if p is param), None)
        for call, caller in sites:
            value = None
            plain = []
            for a in call.args:
                if a.star == "*":
                    break  # positions after *args are unknown
                if a.keyword is None and not a.star:
                    plain.append(a)
            if index is not None and index < len(plain):
                value = plain[index].value
            elif any(a.star for a in call.args):
                return False  # may come through *args / **kwargs
            else:
                value = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)
            if value is None:
                value = param.default
            if dotted_name(value) in self.imported:
                continue  # another module's class (`Net(layers.Block, ...)`)
            if not isinstance(value, cst.Name):
                return False
            if value.value in self.classes and self.class_takes_rngs(self.classes[value.value]):
                continue
            if caller is not None and self._module_parameter(value.value, caller, seen):
                continue
            return False
        return True

    def layer_factory(self, name: str, func: cst.FunctionDef, cls: Optional[cst.ClassDef], depth: int = 0) -> bool:
        """``name`` holds a layer factory in ``func``: a parameter annotated ``Callable[..., nn.Module]``
        or with a layer class as its default (``norm_layer=nn.BatchNorm2d``), or a local assigned
        one (``norm_layer = nn.BatchNorm2d``, ``partial(nn.LayerNorm, eps=1e-6)``, or
        ``self._norm_layer`` that ``__init__`` set from such a name). Calls of it get rngs=rngs:
        the port's classes and factories for torch layers all take it (JX017)."""
        params = [*func.params.posonly_params, *func.params.params, *func.params.kwonly_params]
        param = next((p for p in params if p.name.value == name), None)
        if param is not None:
            if param.annotation is not None:
                text = code(param.annotation.annotation)
                if "Callable" in text and "Module" in text:
                    return True
            if param.default is not None and self._layer_value(param.default):
                return True
        for stmt in self._assigns(func):
            if not any(isinstance(t.target, cst.Name) and t.target.value == name for t in stmt.targets):
                continue
            value = stmt.value
            if self._layer_value(value):
                return True
            if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name) \
                    and self._factory_sequence(value.value.value, func):
                return True  # an element of a sequence of them (`conv_block = blocks[0]`)
            if (cls is not None and depth < 2 and isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name)
                    and value.value.value == "self"):
                if self._attribute_factory(value.attr.value, cls, depth):
                    return True
        return False

    def _factory_sequence(self, name: str, func: cst.FunctionDef) -> bool:
        """``name`` holds a list or tuple of module classes / layer factories in ``func``: a
        parameter annotated as one (``Optional[list[Callable[..., nn.Module]]]``) or assigned a
        list or tuple literal of them (``blocks = [BasicConv2d, Inception]``)."""
        params = [*func.params.posonly_params, *func.params.params, *func.params.kwonly_params]
        param = next((p for p in params if p.name.value == name), None)
        if param is not None and param.annotation is not None:
            text = code(param.annotation.annotation)
            if "Callable" in text and "Module" in text and ("list" in text.lower() or "tuple" in text.lower()
                                                            or "Sequence" in text):
                return True
        for stmt in self._assigns(func):
            if any(isinstance(t.target, cst.Name) and t.target.value == name for t in stmt.targets) \
                    and isinstance(stmt.value, (cst.List, cst.Tuple)) and stmt.value.elements \
                    and all(self._layer_value(e.value) for e in stmt.value.elements):
                return True
        return False

    def _attribute_factory(self, attr: str, cls: cst.ClassDef, depth: int) -> bool:
        """``self.<attr>`` is set in the class's ``__init__`` from a layer factory."""
        init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
        if init is None:
            return False
        for stmt in self._assigns(init):
            if any(
                    isinstance(t.target, cst.Attribute) and isinstance(t.target.value, cst.Name)
                    and t.target.value.value == "self" and t.target.attr.value == attr for t in stmt.targets):
                value = stmt.value
                if self._layer_value(value) or (isinstance(value, cst.Name) and self.layer_factory(value.value, init, cls, depth + 1)):
                    return True
        return False

    def _assigns(self, func: cst.FunctionDef) -> list:
        """The assignments in ``func``'s body (not in nested scopes), in walk order; kept per
        function: each call in a function asks for them again."""
        found = self._assign_cache.get(func)
        if found is None:
            found = self._assign_cache[func] = [n for n in astutil.walk(func.body) if isinstance(n, cst.Assign)]
        return found

    def _layer_value(self, value: cst.BaseExpression) -> bool:
        """A torch layer class as a value (or what JX017 made of it), a module class of the
        file, or functools.partial of one."""
        from . import _layers  # circular at import time

        if isinstance(value, cst.Call) and (self.ctx.qualname(value.func) or "").endswith("partial") and value.args:
            return self._layer_value(value.args[0].value)
        if isinstance(value, cst.Name) and (value.value in _layers.VALUE_NAMES or value.value in self.classes):
            return True
        if dotted_name(value) in self.imported:
            return True  # another module's class or factory (`norm_layer=LayerNorm2d` imported)
        qual = self.ctx.qualname(value) or ""
        return qual.startswith("torch.nn.") and qual[len("torch.nn."):] in _layers.LAYERS

    def _owner(self, func: cst.FunctionDef) -> Optional[cst.ClassDef]:
        for stmt in self.ctx.module.body:
            if isinstance(stmt, cst.ClassDef) and any(s is func for s in stmt.body.body):
                return stmt
        return None

    def _call_sites(self, func: cst.FunctionDef) -> list:
        """(call, the function it sits in or None) for every call of ``func`` in the file: a
        method through ``self.<name>(...)`` in its class, ``__init__`` through the class name,
        a top-level function through its name."""
        cls = self._owner(func)
        found = []
        for call, caller, caller_cls in self._all_calls():
            f = call.func
            if cls is None:
                if isinstance(f, cst.Name) and f.value == func.name.value and any(s is func for s in self.ctx.module.body):
                    found.append((call, caller))
            elif func.name.value == "__init__":
                if isinstance(f, cst.Name) and f.value == cls.name.value:
                    found.append((call, caller))
            elif caller_cls is cls and isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) \
                    and f.value.value == "self" and f.attr.value == func.name.value:
                found.append((call, caller))
        return found

    def _all_calls(self) -> list:
        if not hasattr(self, "_calls"):
            calls = []
            for stmt in self.ctx.module.body:
                if isinstance(stmt, cst.FunctionDef):
                    calls += [(c, stmt, None) for c in astutil.calls_in(stmt.body)]
                elif isinstance(stmt, cst.ClassDef):
                    for s in stmt.body.body:
                        if isinstance(s, cst.FunctionDef):
                            calls += [(c, s, stmt) for c in astutil.calls_in(s.body)]
                else:
                    calls += [(c, None, None) for c in astutil.calls_in(stmt)]
            self._calls = calls
        return self._calls


def _self_attr(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"


def rngs_plan(ctx: FileContext) -> RngsPlan:
    key = ("jx0.rngs_plan",)
    if key not in ctx.cache:
        ctx.cache[key] = RngsPlan(ctx)
    return ctx.cache[key]


def _rngs_functions(ctx: FileContext) -> dict:
    """RngsPlan.functions, as a module fact (porter.rules.module_fact)."""
    return rngs_plan(ctx).functions


def _decorator_name(decorator: cst.Decorator) -> Optional[str]:
    return dotted_name(decorator.decorator)


def _own_kwargs(value: cst.BaseExpression, func: cst.FunctionDef) -> bool:
    """``**value`` in ``func`` may be the function's own ``**kwargs`` passed on (anything but a
    dict the function takes as a plain parameter, ``cls(**cfg)``, or builds itself)."""
    if not isinstance(value, cst.Name):
        return True
    star = func.params.star_kwarg
    if star is not None and star.name.value == value.value:
        return True
    return not any(p.name.value == value.value for p in [*func.params.posonly_params, *func.params.params,
                                                          *func.params.kwonly_params])


def _is_cls_param(name: str, func: cst.FunctionDef) -> bool:
    """``name`` is the class parameter of ``func``, a classmethod."""
    positional = [*func.params.posonly_params, *func.params.params]
    return bool(positional) and positional[0].name.value == name and any(
        _decorator_name(d) == "classmethod" for d in func.decorators)


def _returns(func: cst.FunctionDef) -> bool:
    return any(isinstance(n, cst.Return) and n.value is not None for n in astutil.walk(func.body))


def enclosing_function(ctx: FileContext) -> Optional[cst.FunctionDef]:
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, cst.FunctionDef):
            return anc
        if isinstance(anc, (cst.Lambda, cst.ClassDef)):
            return None
    return None


def in_rngs_scope(ctx: FileContext) -> bool:
    """The current node sits in a function that has (or gets) an ``rngs`` parameter."""
    func = enclosing_function(ctx)
    if func is not None and (func in module_fact(ctx, _rngs_functions) or has_param(func, "rngs")):
        return True
    where = scope_statement(ctx)
    return where is not None and assigns_rngs_before(*where)


def root_kind(cls: cst.ClassDef, ctx: FileContext, seen=None) -> Optional[str]:
    """"torch" or "nnx": what the class's chain of module classes of the file ends in."""
    seen = seen or set()
    if cls.name.value in seen:
        return None
    seen.add(cls.name.value)
    kind = direct_base(cls, ctx)
    if kind != "file":
        return kind
    for base in cls.bases:
        name = dotted_name(base.value)
        if name in module_classes(ctx):
            return root_kind(module_classes(ctx)[name], ctx, seen)
        if name in _program.rngs_callables(ctx):
            return "torch"  # a torch module class of another module of the program (ported there)
    return None


def add_rngs_param(nnx: str):
    """An Edit replacement for a FunctionDef: a keyword-only ``rngs: nnx.Rngs`` parameter."""

    def apply(func: cst.FunctionDef) -> cst.FunctionDef:
        if has_param(func, "rngs"):
            return func
        params = func.params
        new = cst.Param(cst.Name("rngs"), annotation=cst.Annotation(cst.parse_expression(f"{nnx}.Rngs")))
        star = params.star_arg
        if star is cst.MaybeSentinel.DEFAULT or star is None:
            star = cst.ParamStar()
        kwonly = list(params.kwonly_params)
        if kwonly and kwonly[-1].comma is cst.MaybeSentinel.DEFAULT:
            kwonly[-1] = kwonly[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        plain = list(params.params)
        if plain and not isinstance(plain[-1].comma, cst.Comma):
            plain[-1] = plain[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        if params.star_kwarg is not None:
            new = new.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return func.with_changes(params=params.with_changes(params=plain, star_arg=star, kwonly_params=[*kwonly, new]))

    return apply


def spaced(statements: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """Two blank lines before every definition after the first (PEP 8 between top-level defs)."""
    return [
        s.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()]) if i else s.with_changes(leading_lines=[])
        for i, s in enumerate(statements)
    ]


def scope_statement(ctx: FileContext):
    """(scope, statement): the function or module the current node runs in, and the statement
    of that scope's own body that contains it; None where a layer built here cannot be given a
    local ``rngs`` (class bodies, lambdas, methods of module classes: their layers belong in
    ``__init__``)."""
    anchor = None
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, (cst.Lambda, cst.ClassDef)):
            return None
        if isinstance(anc, cst.FunctionDef):
            if enclosing_module_class_of(anc, ctx) is not None:
                return None
            return (anc, anchor) if anchor is not None else None
        if isinstance(anc, cst.BaseStatement):
            anchor = anc
    return (ctx.module, anchor) if anchor is not None else None


def enclosing_module_class_of(func: cst.FunctionDef, ctx: FileContext) -> Optional[cst.ClassDef]:
    seen = False
    for anc in reversed(ctx.ancestors):
        if anc is func:
            seen = True
            continue
        if seen and isinstance(anc, cst.ClassDef):
            return anc if module_classes(ctx).get(anc.name.value) is anc else None
        if seen and isinstance(anc, cst.FunctionDef):
            return None
    return None


def scope_body(scope) -> list:
    return list(scope.body) if isinstance(scope, cst.Module) else list(scope.body.body)


def assigns_rngs_before(scope, anchor) -> bool:
    """``rngs = ...`` is a statement of the scope's body before ``anchor`` (a port's local stream)."""
    for stmt in scope_body(scope):
        if stmt is anchor:
            return False
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign) and any("rngs" in astutil.target_names(t.target) for t in small.targets):
                    return True
    return False


_MANUAL_SEEDS = ("torch.manual_seed", "torch.random.manual_seed")


def seed_in(scope, anchor, ctx: FileContext) -> str:
    """The seed the scope's statements before ``anchor`` give torch: the argument of a
    `torch.manual_seed(seed)` they run, or of a call of the file's own seeding function
    (`set_seed(args.seed)`, whose body calls `torch.manual_seed` of its parameter); else "0".
    A definition runs nothing: the `torch.manual_seed(worker_id)` of a DataLoader's
    `worker_init_fn` seeds no model."""
    helpers = _seeding_functions(ctx)
    for stmt in scope_body(scope):
        if stmt is anchor:
            break
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        for call in astutil.calls_in(stmt):
            if not call.args:
                continue
            name = ctx.qualname(call.func) or dotted_name(call.func)
            if name in _MANUAL_SEEDS:
                return code(call.args[0].value)
            if name in helpers:
                seed = astutil.arg(call, helpers[name][0], helpers[name][1])
                if seed is not None:
                    return code(seed.value)
    return "0"


def _seeding_functions(ctx: FileContext) -> dict[str, tuple[str, int]]:
    """The file's top-level functions that call `torch.manual_seed` of one of their parameters:
    name -> (that parameter, its position)."""
    key = ("jax.seeding_functions", ctx.module)
    if key not in ctx.cache:
        out: dict[str, tuple[str, int]] = {}
        for stmt in ctx.module.body:
            if not isinstance(stmt, cst.FunctionDef):
                continue
            names = [p.name.value for p in astutil.params(stmt.params)]
            for call in astutil.calls_in(stmt.body):
                if ctx.qualname(call.func) in _MANUAL_SEEDS and call.args and isinstance(call.args[0].value, cst.Name) \
                        and call.args[0].value.value in names:
                    out[stmt.name.value] = (call.args[0].value.value, names.index(call.args[0].value.value))
                    break
        ctx.cache[key] = out
    return ctx.cache[key]


# --------------------------------------------------------------------------------------
# torch.nn.init and sampling calls the NNX rules port (JX012, JX014) and others read
# --------------------------------------------------------------------------------------
# torch.nn.init function -> (port function, draws random numbers)
INITS = {
    "uniform_": True, "normal_": True, "trunc_normal_": True, "constant_": False, "ones_": False, "zeros_": False,
    "xavier_uniform_": True, "xavier_normal_": True, "kaiming_uniform_": True, "kaiming_normal_": True,
    "orthogonal_": True,
}
# torch.nn.init's deprecated spellings without the underscore (still in torch, with a warning)
_INIT_ALIASES = {name[:-1]: name for name in INITS if name.endswith("_") and name not in ("ones_", "zeros_",
                                                                                        "trunc_normal_")}
RANDOM_INITS = {f"torch.nn.init.{name}" for name, random in INITS.items() if random}
# the port's init_* functions that draw random numbers (they take key=rngs.params())
RANDOM_HELPERS = {f"init_{name}" for name, random in INITS.items() if random}


def init_name(qual: Optional[str]) -> Optional[str]:
    """The torch.nn.init function ``qual`` names (``normal_``), a deprecated alias by its
    current name (``init.orthogonal`` -> ``orthogonal_``); None for another name."""
    if qual and qual.startswith("torch.nn.init."):
        name = qual[len("torch.nn.init."):]
        return _INIT_ALIASES.get(name, name)
    return None


def handled_tree_walk(call: cst.Call, ctx) -> bool:
    """``self.modules()`` as the iterable of ``for m in ...`` and ``next(self.parameters())``:
    translated by JX012; parameter counts (:func:`parameter_count`): JX022's (JX090 leaves
    them alone)."""
    method = astutil.method_name(call)
    parent = ctx.ancestors[-2] if len(ctx.ancestors) > 1 else None
    if parameter_count_call(call, ctx):
        return True  # a parameter count: JX022's
    if method == "modules" and not call.args:
        return isinstance(parent, cst.For) and parent.iter is call and isinstance(parent.target, cst.Name)
    if method == "named_parameters" and not call.args:
        return isinstance(parent, cst.For) and parent.iter is call and named_parameters_handle(parent, ctx) is not None
    if method == "parameters" and not call.args:
        arg_parent = ctx.ancestors[-3] if len(ctx.ancestors) > 2 else None
        return isinstance(parent, cst.Arg) and isinstance(arg_parent, cst.Call) \
            and isinstance(arg_parent.func, cst.Name) and arg_parent.func.value == "next" and len(arg_parent.args) == 1
    return False


# --------------------------------------------------------------------------------------
# Models a torch library builds (they stay torch modules in a JAX port of the script)
# --------------------------------------------------------------------------------------
# torchvision.models' functions that return no model
_TORCHVISION_NOT_MODELS = frozenset({"get_weight", "get_model_weights", "get_model_builder", "list_models"})
_MODEL_CHAIN = ("to", "cuda", "cpu", "train", "eval", "float", "half", "double", "bfloat16", "requires_grad_")


def ported_library_call(func: cst.BaseExpression, ctx: FileContext) -> bool:
    """``func`` is a constructor of library model code ported with the program (porter.program's
    ``ported_libraries``: ``torchvision.models.resnet18``), or is picked from such a module by
    name (``models.__dict__[arch]``, ``getattr(models, arch)``)."""
    from porter import program

    if program.ported_library(ctx.qualname(func) or ""):
        return True
    if isinstance(func, cst.Subscript) and isinstance(func.value, cst.Attribute) and func.value.attr.value == "__dict__":
        return program.ported_library(ctx.qualname(func.value.value) or "", whole_module=True)
    if isinstance(func, cst.Call) and ctx.qualname(func.func) == "builtins.getattr" and func.args:
        return program.ported_library(ctx.qualname(func.args[0].value) or "", whole_module=True)
    return False


def library_model_factory(call: cst.BaseExpression, ctx: FileContext) -> Optional[str]:
    """The qualified name of the torch model library function ``call`` calls when that builds a
    model: a model builder of ``torchvision.models`` (and its detection, segmentation, video
    subpackages; ``get_model``), ``timm``'s ``create_model``, ``torch.hub.load``, a
    ``transformers`` class's ``from_pretrained`` / ``from_config`` (not a tokenizer's, a
    config's or a processor's); a ``.to(device)`` / ``.cuda()`` / ``.eval()`` chain on such a
    call counts as the call. None otherwise."""
    while isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value in _MODEL_CHAIN:
        call = call.func.value
    if not isinstance(call, cst.Call) or ported_library_call(call.func, ctx):
        return None
    qual = ctx.qualname(call.func) or ""
    last = qual.rsplit(".", 1)[-1]
    if qual.startswith("torchvision.models.") and last[:1].islower() and last not in _TORCHVISION_NOT_MODELS:
        return qual
    if qual.split(".")[0] == "timm" and last == "create_model":
        return qual
    if qual in ("torch.hub.load",):
        return qual
    if qual.split(".")[0] == "transformers" and last in ("from_pretrained", "from_config"):
        owner = qual.split(".")[-2] if qual.count(".") >= 2 else ""
        if not any(word in owner for word in ("Tokenizer", "Config", "Processor", "FeatureExtractor")):
            return qual
    return None


def library_models(ctx: FileContext) -> dict[str, tuple[str, cst.Call]]:
    """Names (``model``, ``self.backbone``) the file binds to a model a torch library builds
    (:func:`library_model_factory`): name -> (the factory's qualified name, the call). A module
    fact."""
    return module_fact(ctx, _library_models_of)


def _library_models_of(ctx: FileContext) -> dict[str, tuple[str, cst.Call]]:
    found: dict[str, tuple[str, cst.Call]] = {}
    for node in astutil.walk(ctx.module, into_functions=True):
        if isinstance(node, (cst.Assign, cst.AnnAssign)) and node.value is not None:
            qual = library_model_factory(node.value, ctx)
            if qual is None:
                continue
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for target in targets:
                name = dotted_name(target)
                if name and name not in found:
                    found[name] = (qual, node.value)  # type: ignore[assignment]
    return found


_MODEL_ITERATORS = ("parameters", "named_parameters", "buffers", "named_buffers", "modules", "named_modules", "children")


def library_model_value(expr: cst.BaseExpression, ctx: FileContext) -> bool:
    """``expr`` is a torch library model (:func:`library_models`) or a value read from one: its
    attributes (``model.fc``), or the loop variable of a loop or comprehension over its
    ``parameters()`` / ``buffers()`` / ``modules()`` (``p`` in ``for p in model.parameters()``).
    Such values stay torch tensors and modules in a JAX port of the script."""
    models = library_models(ctx)
    if not models:
        return False
    name = dotted_name(expr)
    if name is None:
        return False
    if any(name == m or name.startswith(m + ".") for m in models):
        return True
    root = name.split(".")[0]
    for anc in reversed(ctx.ancestors):
        loops: list = []
        if isinstance(anc, cst.For):
            loops = [anc]
        elif isinstance(anc, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
            comp: Optional[cst.CompFor] = anc.for_in
            while comp is not None:
                loops.append(comp)
                comp = comp.inner_for_in
        for loop in loops:
            if root in set(astutil.target_names(loop.target)):
                it = loop.iter
                return (isinstance(it, cst.Call) and astutil.method_name(it) in _MODEL_ITERATORS
                        and dotted_name(it.func.value) in models)  # type: ignore[attr-defined]
    return False


_COUNT_METHODS = ("numel", "nelement")


def parameter_count_call(call: cst.Call, ctx) -> bool:
    """``call`` (the current node) is the ``M.parameters()`` of a :func:`parameter_count`."""
    parent = ctx.ancestors[-2] if len(ctx.ancestors) > 1 else None
    if not (isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is call):
        return False
    outer = ctx.ancestors[-5:-2] if isinstance(parent, cst.CompFor) else ()
    return parameter_count(parent, tuple(reversed(outer)), ctx) is not None


def parameter_count(loop, outer: tuple, ctx) -> Optional[tuple[str, list]]:
    """``sum(p.numel() for p in M.parameters())`` (a generator or a list comprehension given to
    ``sum``; ``for _, p in M.named_parameters()``; ``if p.requires_grad``; ``p.nelement()``,
    ``torch.numel(p)``, ``p.size`` as JX102 writes ``numel``) or a loop adding them up
    (``for p in M.parameters(): n += p.numel()``): a count of the model's parameter elements.
    ``loop`` is the ``CompFor`` (``outer``: its comprehension, the ``Arg`` and the call holding
    it, innermost first) or the ``For``. Gives the loop variable ``p`` and the ``if`` clauses
    that only ask ``p.requires_grad`` (every nnx.Param of the port is trained), or None."""
    call = loop.iter
    if not isinstance(call, cst.Call) or call.args or astutil.method_name(call) not in ("parameters", "named_parameters"):
        return None
    if dotted_name(call.func.value) in library_models(ctx):  # type: ignore[attr-defined]
        return None  # a torch library's model stays a torch module (JX901 reports where it is built)
    target = loop.target
    named = astutil.method_name(call) == "named_parameters"
    if named:
        if not (isinstance(target, cst.Tuple) and len(target.elements) == 2
                and all(isinstance(e.value, cst.Name) for e in target.elements)):
            return None
        name, target = target.elements[0].value.value, target.elements[1].value  # type: ignore[attr-defined]
    if not isinstance(target, cst.Name):
        return None
    handle = target.value
    if isinstance(loop, cst.CompFor):
        if len(outer) < 3 or loop.inner_for_in is not None:
            return None
        comp, arg, total = outer[:3]
        if not (isinstance(comp, (cst.GeneratorExp, cst.ListComp)) and comp.for_in is loop and isinstance(arg, cst.Arg)
                and isinstance(total, cst.Call) and isinstance(total.func, cst.Name) and total.func.value == "sum"
                and len(total.args) == 1 and arg.star == "" and arg.keyword is None):
            return None
        grad_ifs = [c for c in loop.ifs if isinstance(c.test, cst.Attribute) and isinstance(c.test.value, cst.Name)
                    and c.test.value.value == handle and c.test.attr.value == "requires_grad"]
        scope = [comp.elt, *(c.test for c in loop.ifs if c not in grad_ifs)]
    else:
        if loop.orelse is not None or not all(
                isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, cst.AugAssign) and isinstance(x.operator, cst.AddAssign)
                                                              for x in s.body) for s in loop.body.body):
            return None
        grad_ifs = []
        scope = [x.value for s in loop.body.body for x in s.body]  # type: ignore[attr-defined]
    if named and any(isinstance(n, cst.Name) and n.value == name for e in scope for n in astutil.walk(e, into_functions=True)):
        return None  # the torch name is read: not a plain count
    uses = counts = 0
    for expr in scope:
        for n in astutil.walk(expr, into_functions=True):
            if isinstance(n, cst.Name) and n.value == handle:
                uses += 1
            elif isinstance(n, cst.Call) and not n.args and isinstance(n.func, cst.Attribute) \
                    and n.func.attr.value in _COUNT_METHODS and isinstance(n.func.value, cst.Name) and n.func.value.value == handle:
                counts += 1
            elif isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "size":
                uses += 1  # torch's p.size(): a shape, not a count
            elif isinstance(n, cst.Call) and ctx.qualname(n.func) == "torch.numel" and len(n.args) == 1 \
                    and isinstance(n.args[0].value, cst.Name) and n.args[0].value.value == handle:
                counts += 1
            elif isinstance(n, cst.Attribute) and n.attr.value == "size" and isinstance(n.value, cst.Name) \
                    and n.value.value == handle:
                counts += 1
    if counts == 0 or uses != counts:
        return None
    return handle, grad_ifs


def named_parameters_handle(loop: cst.For, ctx) -> Optional[str]:
    """``for name, p in self.named_parameters():`` (or its port, ``torch_named_parameters(self)``)
    whose body uses ``p`` only as the tensor of translated ``nn.init`` calls: ``p``'s name (the
    port's ``p`` is the (module, torch name) pair the init_* functions take)."""
    target = loop.target
    if not (isinstance(target, cst.Tuple) and len(target.elements) == 2
            and all(isinstance(e.value, cst.Name) for e in target.elements)):
        return None
    handle = target.elements[1].value.value  # type: ignore[attr-defined]
    inits = 0
    for node in astutil.walk(loop.body, into_functions=True):
        if isinstance(node, cst.Call) and init_name(ctx.qualname(node.func)) in INITS and node.args \
                and node.args[0].keyword is None and isinstance(node.args[0].value, cst.Name) \
                and node.args[0].value.value == handle:
            inits += 1
    uses = sum(isinstance(n, cst.Name) and n.value == handle for n in astutil.walk(loop.body, into_functions=True))
    return handle if inits and uses == inits else None


# torch sampling function -> (jax.random function, takes a shape (not a tensor to imitate))
SAMPLERS = {
    "torch.randn_like": ("normal", False),
    "torch.rand_like": ("uniform", False),
    "torch.randn": ("normal", True),
    "torch.rand": ("uniform", True),
}
RNGS_STREAM = "rngs"  # the attribute holding the module's nnx.Rngs


def module_method(ctx) -> Optional[tuple[cst.ClassDef, cst.FunctionDef]]:
    """(module class, method) around the current node: a method other than __init__ of a
    top-level module class (torch's or already ported)."""
    func = None
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, cst.Lambda):
            return None
        if isinstance(anc, cst.FunctionDef):
            if func is not None:
                return None  # a nested function
            func = anc
        elif isinstance(anc, cst.ClassDef):
            if func is None or func.name.value == "__init__":
                return None
            cls = module_classes(ctx).get(anc.name.value)
            return (cls, func) if cls is anc and any(s is func for s in cls.body.body) else None
    return None


def multinomial_args(call: cst.Call) -> Optional[tuple[cst.BaseExpression, cst.BaseExpression, bool]]:
    """``torch.multinomial(input, num_samples, replacement=False)``: (input, num_samples,
    replacement) when replacement is a literal (or absent) and nothing else is passed."""
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if any(a.star for a in call.args) or set(keywords) - {"input", "num_samples", "replacement"} or len(positional) > 3:
        return None
    names = ("input", "num_samples", "replacement")
    bound = dict(zip(names, positional))
    if set(bound) & set(keywords):
        return None
    bound.update(keywords)
    if "input" not in bound or "num_samples" not in bound:
        return None
    replacement = literal(bound["replacement"]) if "replacement" in bound else False
    if replacement not in (True, False):
        return None
    return bound["input"], bound["num_samples"], replacement


def sampler(call: cst.Call, ctx) -> Optional[tuple[str, bool]]:
    """The translation of a torch sampling call JX014 ports inside a module method."""
    qual = ctx.qualname(call.func) or ""
    if qual == "torch.multinomial" and module_method(ctx) is not None:
        return ("multinomial", False) if multinomial_args(call) is not None else None
    spec = SAMPLERS.get(qual)
    if spec is None or module_method(ctx) is None:
        return None
    if any(a.star or (a.keyword is not None and a.keyword.value not in ("dtype", "device", "requires_grad")) for a in call.args):
        return None  # generator=, out=, layout=...: JX101 reports it
    if spec[1]:
        if not [a for a in call.args if a.keyword is None]:
            return None
    elif len([a for a in call.args if a.keyword is None]) != 1:
        return None
    return spec


# functional dropout (JX107): qualname -> the name of its training flag
# the dropouts JX107 ports: (the name of the training flag, the spatial dimensions of a channel
# dropout's batched input: one draw per (sample, channel); 0 for an elementwise dropout)
DROPOUTS = {"torch.nn.functional.dropout": ("training", 0), "torch.dropout": ("train", 0),
            "torch.nn.functional.dropout1d": ("training", 1), "torch.nn.functional.dropout2d": ("training", 2),
            "torch.nn.functional.dropout3d": ("training", 3)}


def dropout_call(call: cst.Call, ctx) -> Optional[dict]:
    """The arguments of `F.dropout(input, p=0.5, training=True, inplace=False)` /
    `torch.dropout(input, p, train)` / `F.dropout1d/2d/3d` as code ("input", "p", "training";
    absent: torch's default), "spatial" (a channel dropout's spatial dimensions, 0 for
    elementwise dropout), and "module": the (class, method) the call is in (also inside a
    function nested in the method: its `self` is the method's; :func:`rngs_scope`), else None.
    None when it is not such a call or its arguments cannot be bound (a star argument, an
    unknown keyword)."""
    known = DROPOUTS.get(ctx.qualname(call.func) or "")
    if known is None or any(a.star for a in call.args):
        return None
    flag, spatial = known
    names = ["input", "p", flag, "inplace"]
    bound: dict = {}
    for i, a in enumerate(call.args):
        if a.keyword is None:
            if i >= len(names):
                return None
            bound[names[i]] = a.value
        elif a.keyword.value in names:
            bound[a.keyword.value] = a.value
        else:
            return None
    if "input" not in bound:
        return None
    return {"input": code(bound["input"]), "p": code(bound["p"]) if "p" in bound else "0.5",
            "training": code(bound[flag]) if flag in bound else "True", "spatial": spatial,
            "module": rngs_scope(ctx)}


def rngs_scope(ctx) -> Optional[tuple[cst.ClassDef, cst.FunctionDef]]:
    """(module class, method) whose nnx.Rngs (`self.rngs`, kept by :func:`keep_rngs`) the
    current node can draw random numbers from: a method other than `__init__` of a module
    class of the file, or a function nested in such a method (its `self` is the method's).
    None in a lambda, in `__init__`, outside a module class (JX107, the op table's calls that
    draw: attention dropout)."""
    method = None
    for anc in reversed(ctx.ancestors[:-1]):
        if isinstance(anc, cst.Lambda):
            return None
        if isinstance(anc, cst.FunctionDef):
            method = anc
        elif isinstance(anc, cst.ClassDef):
            cls = module_classes(ctx).get(anc.name.value)
            if cls is anc and method is not None and method.name.value != "__init__" \
                    and any(s is method for s in cls.body.body):
                return cls, method
            return None
    return None


def keep_rngs(cls: cst.ClassDef) -> Optional[tuple]:
    """The edits that make a module class keep its nnx.Rngs for its methods' draws:
    `self.rngs = rngs` appended to `__init__` (none when it already does); None when the
    class has no `__init__` yet (JX001 adds one first, with its `rngs` parameter)."""
    init = next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)
    if init is None:
        return None
    if stores_rngs(init):
        return ()
    return (Edit(init.body, appended(f"self.{RNGS_STREAM} = rngs")),)


def stores_rngs(init: cst.FunctionDef) -> bool:
    """`__init__` keeps its nnx.Rngs as `self.rngs` (JX014, JX107)."""
    return f"self.{RNGS_STREAM} = " in code(init.body)


def appended(text: str):
    """An edit of a function body: `text` (one statement) appended as its last statement (its
    `pass` statements dropped: another edit of the pass may have added to a body of only
    `pass`); a body that has the statement already stays as it is
    (two rules that both need it in one pass append it once)."""
    new = cst.parse_statement(text)

    def apply(body: cst.IndentedBlock) -> cst.IndentedBlock:
        stmts = list(body.body)
        if any(s.deep_equals(new) for s in stmts):
            return body  # another rule's edit of the same pass appended it already
        stmts = [s for s in stmts if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                                          and isinstance(s.body[0], cst.Pass) and not s.trailing_whitespace.comment
                                          and not any(line.comment for line in s.leading_lines))]
        return body.with_changes(body=[*stmts, new])

    return apply


# a fresh tensor filled with random numbers where a module is built (JX108)
FRESH_TENSORS = ("torch.empty", "torch.zeros", "torch.ones", "jax.numpy.zeros", "jax.numpy.ones", "jax.numpy.empty")
RANDOM_FILLS = {"normal_": ("mean", "std"), "uniform_": ("from", "to")}


# a random factory called where a module is built (JX108): qualname -> jax.random's sampler
RANDOM_DRAWS = {"torch.randn": "normal", "torch.rand": "uniform"}


def fresh_random_draw(call: cst.Call, ctx) -> bool:
    """`torch.randn(shape)` / `torch.rand(shape)` in a function that has the module's rngs
    (`__init__`, a layer builder), not in a method whose draws JX014 takes from `self.rngs`:
    JX108 draws it from `rngs.params()` (JX101 leaves it)."""
    if (ctx.qualname(call.func) or "") not in RANDOM_DRAWS or sampler(call, ctx) is not None:
        return False
    func = enclosing_function(ctx)  # (a script's own draws stay torch's: JX101's host draw)
    return func is not None and (func in module_fact(ctx, _rngs_functions) or has_param(func, "rngs"))


def fresh_random_fill(call: cst.Call, ctx) -> bool:
    """`torch.empty(shape).normal_(...)` / `.uniform_(...)` (or on zeros / ones, torch's or
    jnp's) in a function that has the module's rngs: JX108 draws it from them (JX102 leaves it)."""
    f = call.func
    return isinstance(f, cst.Attribute) and f.attr.value in RANDOM_FILLS and isinstance(f.value, cst.Call) \
        and (ctx.qualname(f.value.func) or "") in FRESH_TENSORS and in_rngs_scope(ctx)
