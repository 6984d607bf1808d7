"""Torch scripts' device strings and command-line device options, read the same way by every
target that ports torch code (torch_xla, JAX): which reads of a device string are device uses
(``torch.device(d)``, ``.to(d)``, ``device=d``), device-type tests or text, and whether a
command-line option whose default is a CUDA string is read only so.

What each target makes of the answer differs (torch_xla's default becomes ``'xla'``, the JAX
port's ``'cpu'`` for the torch code that stays): the rules decide, with `option_blocker`.
"""
from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from porter.astutil import arg, children, code, function_locals, name_values, string_value, walk
from porter.context import FileContext
from porter.rules import module_fact

OTHER_USE = "other"

# Tensor methods whose `device=` places the result (and `.to`).
_PLACING_METHODS = ("to", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor")
_FIRST_ARG_DEVICE = ("torch.device", "torch.cuda.set_device", "torch.cuda.device")
_LOADERS = ("torch_xla.distributed.parallel_loader.MpDeviceLoader",)  # (loader, device)


_CUDA = re.compile(r"cuda(:\d+)?$")
_CUDA_PREFIX = re.compile(r"cuda:(\{\}|%[dis]|)$")


def is_cuda_string(node: cst.CSTNode) -> bool:
    """'cuda', 'cuda:0', f'cuda:{rank}', 'cuda:{}'.format(i), 'cuda:%d' % i, 'cuda:' + str(i)."""
    value = string_value(node)
    if value is not None:
        return bool(_CUDA.match(value))
    if isinstance(node, cst.FormattedString):
        texts = [p for p in node.parts if isinstance(p, cst.FormattedStringText)]
        return (
            len(node.parts) == 2
            and isinstance(node.parts[0], cst.FormattedStringText)
            and node.parts[0].value == "cuda:"
            and len(texts) == 1
        )
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "format":
        inner = string_value(node.func.value)
        return inner is not None and inner == "cuda:{}"
    if isinstance(node, cst.BinaryOperation):
        left = string_value(node.left)
        if left is None:
            return False
        if isinstance(node.operator, cst.Modulo):
            return bool(_CUDA_PREFIX.match(left)) and left != "cuda:"
        if isinstance(node.operator, cst.Add):
            return left == "cuda:"
    return False



# TX103: functions a script hands its parsed command line (the argparse namespace, or
# `vars(namespace)` / `namespace.__dict__`), and what each does with a device option there.
# Read in the installed sources (timm 1.0.31, the framework venv) and wandb's documentation.
NAMESPACE_SETUP = "setup"    # reads the device option as a device string and sets the process up on it
NAMESPACE_UNREAD = "unread"  # reads other options only (no `device` in its source)
NAMESPACE_RECORD = "record"  # keeps the options as a record (a checkpoint, a config file, an experiment log)
NAMESPACE_FUNCTIONS = {
    # timm/utils/distributed.py: `init_distributed_device_so(device=getattr(args, 'device', 'cuda'))`
    # splits off the device type; it asserts torch.cuda.is_available() for 'cuda' only, picks the
    # 'gloo' backend for any type it does not know (a launch of several processes), and the
    # caller returns `torch.device(args.device)`: torch.device('xla') for 'xla', 'cpu' for 'cpu'
    "timm.utils.init_distributed_device": NAMESPACE_SETUP,
    "timm.utils.distributed.init_distributed_device": NAMESPACE_SETUP,
    # args.rank == 0 / args.local_rank == 0
    "timm.utils.is_primary": NAMESPACE_UNREAD,
    "timm.utils.distributed.is_primary": NAMESPACE_UNREAD,
    "timm.utils.distributed.is_global_primary": NAMESPACE_UNREAD,
    "timm.utils.distributed.is_local_primary": NAMESPACE_UNREAD,
    # keys in_chans/chans/input_size/img_size/interpolation/mean/std/crop_pct/crop_mode
    "timm.data.resolve_data_config": NAMESPACE_UNREAD,
    "timm.data.config.resolve_data_config": NAMESPACE_UNREAD,
    # optimizer and schedule hyper-parameters
    "timm.optim.optimizer_kwargs": NAMESPACE_UNREAD,
    "timm.optim._optim_factory.optimizer_kwargs": NAMESPACE_UNREAD,
    "timm.scheduler.scheduler_kwargs": NAMESPACE_UNREAD,
    "timm.scheduler.scheduler_factory.scheduler_kwargs": NAMESPACE_UNREAD,
    # timm/utils/checkpoint_saver.py: `save_state['args'] = self.args` (and args.model as 'arch')
    "timm.utils.CheckpointSaver": NAMESPACE_RECORD,
    "timm.utils.checkpoint_saver.CheckpointSaver": NAMESPACE_RECORD,
    # the run's hyper-parameters, shown in the W&B app (docs.wandb.ai/guides/track/config)
    "wandb.init": NAMESPACE_RECORD,
    "yaml.dump": NAMESPACE_RECORD,
    "yaml.safe_dump": NAMESPACE_RECORD,
    "json.dump": NAMESPACE_RECORD,
    "json.dumps": NAMESPACE_RECORD,
    "builtins.print": NAMESPACE_RECORD,
}


def classify_read(name: cst.Name, stack: list, ctx: FileContext) -> tuple[str, tuple]:
    """What the read ``name`` (the last of ``stack``, its ancestors before it) does with the value."""
    parent = stack[-2] if len(stack) >= 2 else None
    grand = stack[-3] if len(stack) >= 3 else None
    if isinstance(parent, cst.Arg) and parent.value is name and isinstance(grand, cst.Call):
        call = grand
        keyword = parent.keyword.value if parent.keyword is not None else None
        qual = ctx.qualname(call.func) or ""
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        if keyword is None and call.args and call.args[0] is parent:
            if qual in _FIRST_ARG_DEVICE or (method == "to" and not qual.startswith("torch.")):
                return "device", ()
        if keyword is None and len(call.args) > 1 and call.args[1] is parent and qual in _LOADERS:
            return "device", ()
        if keyword == "device" and (qual.startswith(("torch.", "torch_xla.")) or (method in _PLACING_METHODS and not qual)):
            return "device", ()
        if keyword == "map_location" and qual == "torch.load":
            return "device", ()
        if qual == "builtins.print":
            return "text", ()
        return OTHER_USE, ()
    if isinstance(parent, cst.FormattedStringExpression) and parent.expression is name:
        return "text", ()
    comparison = parent if isinstance(parent, cst.Comparison) else grand if isinstance(parent, cst.ComparisonTarget) else None
    if isinstance(comparison, cst.Comparison):
        literals = _test_literals(comparison, name)
        return ("test", literals) if literals is not None else (OTHER_USE, ())
    if isinstance(parent, cst.Attribute) and parent.value is name and parent.attr.value in ("startswith", "endswith") \
            and isinstance(grand, cst.Call) and grand.func is parent and len(grand.args) == 1 \
            and grand.args[0].keyword is None and string_value(grand.args[0].value) is not None:
        first = grand.args[0].value
        return "test", ((first,) if is_cuda_string(first) or string_value(first) == "cuda" else ())
    return OTHER_USE, ()


def _test_literals(comparison: cst.Comparison, name: cst.Name) -> Optional[tuple]:
    """The CUDA literals ``name`` is tested against in ``comparison`` (equality, membership in
    a tuple of strings, a substring test), or None where it is compared with anything else."""
    operands = [comparison.left, *(c.comparator for c in comparison.comparisons)]
    ops = [c.operator for c in comparison.comparisons]
    found: list = []
    for i, op in enumerate(ops):
        left, right = operands[i], operands[i + 1]
        if left is not name and right is not name:
            continue
        other = right if left is name else left
        if isinstance(op, (cst.Equal, cst.NotEqual)) or (isinstance(op, (cst.In, cst.NotIn)) and right is name):
            strings = [other]
        elif isinstance(op, (cst.In, cst.NotIn)) and isinstance(other, (cst.Tuple, cst.List, cst.Set)):
            strings = [e.value for e in other.elements]
        else:
            return None
        if not strings or any(string_value(s) is None for s in strings):
            return None
        found.extend(s for s in strings if is_cuda_string(s))
    return tuple(found)



# --------------------------------------------------------------------------------------
# A device-type string derived from a device (nanoGPT's `device_type = 'cuda' if 'cuda' in
# device else 'cpu'`, for torch.autocast)
# --------------------------------------------------------------------------------------
# The derived string follows the device: with the device 'cpu' it is 'cpu', what the script
# computes when its user passes a CPU device. A read of the device in such a derivation is a
# device use for a rewrite to 'cpu' when every read of the derived name is one too (a device
# use, text, a device type given to torch.autocast / torch.amp), asked the same way.

_TYPE_USES = ("torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast", "torch.amp.GradScaler",
              "torch.get_autocast_dtype", "torch.is_autocast_available")


class Derived(str):
    """A read of a device that only derives a device-type string which follows it (its reads
    are device uses): not provable for a rewrite to any device but 'cpu'. The quoted read."""


def _up(stack: list, node: cst.CSTNode, ctx: FileContext) -> tuple[cst.CSTNode, list]:
    """``node`` (the last of ``stack``) widened over what only re-spells the device:
    ``str(d)``, ``torch.device(d)``, ``d.type`` -> (the widest such expression, its stack)."""
    while len(stack) >= 3:
        parent, grand = stack[-2], stack[-3]
        if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "type" \
                and not (isinstance(grand, cst.Call) and grand.func is parent):
            node, stack = parent, stack[:-1]
            continue
        if isinstance(parent, cst.Arg) and parent.value is node and parent.keyword is None and isinstance(grand, cst.Call) \
                and len(grand.args) == 1 and ctx.qualname(grand.func) in ("builtins.str", "torch.device"):
            node, stack = grand, stack[:-2]
            continue
        break
    return node, stack


def _cpu_value(test: cst.CSTNode, device: cst.CSTNode) -> Optional[bool]:
    """The value of the device-type test ``test`` of ``device`` when the device is 'cpu':
    ``'cuda' in d``, ``d == 'cuda'``, ``d != 'cpu'``, ``d.startswith('cuda')`` (negated with
    ``not``); None for any other test."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _cpu_value(test.expression, device)
        return None if inner is None else not inner
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        op, right = test.comparisons[0].operator, test.comparisons[0].comparator
        other = right if test.left is device else test.left if right is device else None
        text = string_value(other) if other is not None else None
        if text is None:
            return None
        if isinstance(op, (cst.In, cst.NotIn)) and right is device:
            return (text in "cpu") == isinstance(op, cst.In)
        if isinstance(op, (cst.Equal, cst.NotEqual)):
            return (text == "cpu") == isinstance(op, cst.Equal)
        return None
    if isinstance(test, cst.Call) and isinstance(test.func, cst.Attribute) and test.func.value is device \
            and test.func.attr.value == "startswith" and len(test.args) == 1:
        text = string_value(test.args[0].value)
        return None if text is None else "cpu".startswith(text)
    return None


def reads_type(stack: list, ctx: FileContext) -> bool:
    """The read (the last of ``stack``) is made a torch.device whose type is read:
    ``torch.device(d).type``, a device-type string (not a device use)."""
    node, _ = _up(stack, stack[-1], ctx)
    return node is not stack[-1] and isinstance(node, cst.Attribute) and node.attr.value == "type"


def derivation(stack: list, ctx: FileContext) -> Optional[tuple[cst.Assign, list]]:
    """For a read of a device (the last of ``stack``) that is assigned to a name as it is
    (``device_name = args.device``) or derives a device type assigned to a
    name whose value, for the device 'cpu', is 'cpu' (``t = 'cuda' if 'cuda' in d else 'cpu'``,
    ``... if str(d).startswith('cuda') ...``, ``... if torch.device(d).type == 'cuda' ...``,
    ``t = torch.device(d).type``, ``t = d.split(':')[0]``): (the assignment, its stack)."""
    node, stack = _up(stack, stack[-1], ctx)
    value, above = node, stack
    parent = stack[-2] if len(stack) >= 2 else None
    if isinstance(node, cst.Attribute) and node.attr.value == "type" and isinstance(parent, cst.Assign):
        pass  # t = torch.device(d).type: the type itself
    elif isinstance(parent, cst.Assign) and parent.value is node and node is stack[-1]:
        pass  # device_name = args.device: the device under another name
    elif isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "split" \
            and len(stack) >= 4 and isinstance(stack[-3], cst.Call) and isinstance(stack[-4], cst.Subscript) \
            and len(stack[-4].slice) == 1 and code(stack[-4].slice[0].slice) == "0":
        value, above = stack[-4], stack[:-3]  # d.split(':')[0]
    else:
        # a test of the device in `'cuda' if <test> else 'cpu'`
        i = len(stack) - 2
        while i >= 0 and isinstance(stack[i], (cst.Comparison, cst.ComparisonTarget, cst.Attribute, cst.Call, cst.Arg,
                                               cst.UnaryOperation)):
            i -= 1
        if i < 0 or not isinstance(stack[i], cst.IfExp) or stack[i].test is not stack[i + 1]:
            return None
        ifexp = stack[i]
        taken = _cpu_value(ifexp.test, node)
        if taken is None:
            return None
        branch, other = (ifexp.body, ifexp.orelse) if taken else (ifexp.orelse, ifexp.body)
        if string_value(branch) != "cpu" or string_value(other) is None:
            return None
        value, above = ifexp, stack[:i + 1]
    assign = above[-2] if len(above) >= 2 else None
    if isinstance(assign, cst.Assign) and assign.value is value and len(assign.targets) == 1 \
            and isinstance(assign.targets[0].target, cst.Name):
        return assign, above[:-1]
    return None


def _reads_of(scope: cst.CSTNode, name: str, stack: list):
    """(read, its stack) of ``name`` under ``scope`` (whose ancestors are ``stack``), functions
    that bind the name themselves aside."""
    todo = [(scope, stack)]
    while todo:
        node, above = todo.pop()
        here = [*above, node]
        if isinstance(node, cst.FunctionDef) and node is not scope and name in function_locals(node):
            continue
        if isinstance(node, cst.Name) and node.value == name and not _is_store(node, here):
            yield node, here
        todo.extend((c, here) for c in children(node))


def derived_reads(found: tuple[cst.Assign, list]):
    """(read, its stack) of the name a :func:`derivation` assigns, in its scope: the function
    holding the assignment, else the module."""
    assign, above = found
    i = next((k for k in range(len(above) - 1, -1, -1) if isinstance(above[k], cst.FunctionDef)), None)
    scope, scope_stack = (above[i], above[:i]) if i is not None else (above[0], [])
    return _reads_of(scope, assign.targets[0].target.value, scope_stack)


def derived_blocker(ctx: FileContext, stack: list, depth: int = 0) -> Optional[str]:
    """For a read of a device (the last of ``stack``) in a device-type derivation (see
    :func:`derivation`): "" where every read of the derived name is a device use, text or a
    device type given to torch.autocast / torch.amp (or derives another such name), else the
    first read that is not, quoted; None where the read derives nothing. A test of the derived
    name against other devices' strings only (`== 'mps'`, `!= 'cpu'`) reads 'xla' as it read
    'cuda'."""
    found = derivation(stack, ctx)
    if found is None or depth > 3:
        return None
    name = found[0].targets[0].target.value
    for read, here in derived_reads(found):
        kind, literals = classify_read(read, here, ctx)
        if (kind in ("device", "text") and not reads_type(here, ctx)) or _type_use(read, here, ctx):
            continue
        if kind == "test" and not literals:
            continue  # `device_name == 'mps'`: False for 'xla' as for 'cuda'

        if derived_blocker(ctx, here, depth + 1) == "":
            continue
        return f"`{_quote(_context(here))}` ({name} follows the device)"
    return ""


def _type_use(read: cst.CSTNode, stack: list, ctx: FileContext) -> bool:
    """A device type given to torch.autocast / torch.amp (its first argument or device_type=)."""
    parent = stack[-2] if len(stack) >= 2 else None
    grand = stack[-3] if len(stack) >= 3 else None
    if not (isinstance(parent, cst.Arg) and parent.value is read and isinstance(grand, cst.Call)):
        return False
    qual = ctx.qualname(grand.func) or ""
    if qual not in _TYPE_USES:
        return False
    return (parent.keyword is None and grand.args[0] is parent) or (
        parent.keyword is not None and parent.keyword.value in ("device_type", "device"))


# --------------------------------------------------------------------------------------
# A command-line option whose default is a CUDA device string
# --------------------------------------------------------------------------------------
# ``parser.add_argument('--device', default='cuda')`` (on a parser or an argument group): the
# option is *placement only* when every read of it that the file shows is a device use or text
# (as above; a device-type test is not: the port would keep the option's CUDA spelling in it),
# the namespace that holds it is followed from ``parse_args()`` through assignments, returns and
# the parameters of the file's functions, and every other use of the whole namespace is one of
# NAMESPACE_FUNCTIONS (a device setup that accepts 'xla', a function that reads other options,
# a record). Anything else (``getattr(args, ...)``, ``vars(args)`` handed to code porter does
# not know, the namespace stored or passed to a method) may read the option: not provable.

_PARSE_CALLS = ("parse_args", "parse_intermixed_args")
_PARSE_KNOWN = ("parse_known_args", "parse_known_intermixed_args")
_QUOTE = 60


def option_dest(call: cst.Call) -> Optional[str]:
    """The namespace attribute that ``add_argument(...)`` sets, by argparse's rule: ``dest=``,
    else the first long option string, else the first option string, without the leading
    dashes and with '-' as '_' (a positional argument: its name). None where not literal."""
    dest = arg(call, "dest")
    if dest is not None:
        return string_value(dest.value)
    strings = []
    for a in call.args:
        if a.keyword is not None or a.star:
            break
        value = string_value(a.value)
        if value is None:
            return None
        strings.append(value)
    if not strings:
        return None
    if not strings[0].startswith("-"):
        return strings[0]
    chosen = next((s for s in strings if s.startswith("--")), strings[0])
    return chosen.lstrip("-").replace("-", "_")


def _quote(node: cst.CSTNode) -> str:
    text = " ".join(code(node).split())
    return text if len(text) <= _QUOTE else text[:_QUOTE - 3] + "..."


_INSIDE_EXPRESSIONS = (cst.BaseExpression, cst.Arg, cst.ComparisonTarget, cst.BaseElement, cst.BaseDictElement,
                       cst.FormattedStringExpression, cst.Index, cst.SubscriptElement)


def _context(stack: list) -> cst.CSTNode:
    """The read ``stack[-1]`` with what it is read in: the whole expression, or the small
    statement it is part of (``on_gpu = args.device.startswith('cuda')``)."""
    i = len(stack) - 1
    while i > 0 and isinstance(stack[i - 1], _INSIDE_EXPRESSIONS):
        i -= 1
    while i < len(stack) - 1 and not isinstance(stack[i], cst.BaseExpression):
        i += 1
    if i > 0 and isinstance(stack[i - 1], cst.BaseSmallStatement):
        return stack[i - 1]
    return stack[i]


def _is_store(node: cst.CSTNode, stack: list) -> bool:
    parent = stack[-2] if len(stack) >= 2 else None
    if isinstance(parent, (cst.Param, cst.FunctionDef, cst.ClassDef, cst.ImportAlias, cst.NameItem, cst.AsName)):
        return True
    if isinstance(parent, cst.Attribute) and parent.attr is node:
        return True
    if isinstance(parent, cst.Arg) and parent.keyword is node:
        return True
    if isinstance(parent, (cst.AssignTarget, cst.For, cst.CompFor)) and parent.target is node:
        return True
    if isinstance(parent, cst.Element) and len(stack) >= 4 and isinstance(stack[-3], (cst.Tuple, cst.List)) \
            and isinstance(stack[-4], (cst.AssignTarget, cst.For, cst.CompFor)) and stack[-4].target is stack[-3]:
        return True
    return False


def _bound_param(fn: cst.FunctionDef, call: cst.Call, given: cst.Arg) -> Optional[str]:
    """The parameter of ``fn`` that ``given`` (an argument of ``call``) binds, None where it
    goes to ``*args``/``**kwargs`` or an earlier argument is unpacked."""
    positional = [*fn.params.posonly_params, *fn.params.params]
    if given.keyword is None:
        index = 0
        for a in call.args:
            if a is given:
                break
            if a.star:
                return None
            if a.keyword is None:
                index += 1
        return positional[index].name.value if index < len(positional) else None
    named = [*fn.params.params, *fn.params.kwonly_params]
    return given.keyword.value if any(p.name.value == given.keyword.value for p in named) else None


def _option_walk(ctx: FileContext) -> dict:
    options: dict[str, list] = {}  # dest -> [(add_argument call, default node)]
    occurrences: dict[str, list] = {}  # name -> [(Name node, ancestors, enclosing function)]
    local_calls: dict[str, list] = {}  # module-level function name -> [(Call, ancestors)]
    functions: dict[str, Optional[cst.FunctionDef]] = {}
    seeds: set[str] = set()
    parses: list = []  # parse calls whose result is used otherwise than assigned to a name
    blocked: list[str] = []  # whole-namespace uses that may read any option

    def visit(node: cst.CSTNode, stack: list, fn: Optional[cst.FunctionDef]) -> None:
        stack.append(node)
        if isinstance(node, cst.Name):
            occurrences.setdefault(node.value, []).append((node, list(stack), fn))
        elif isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value == "add_argument":
                default = arg(node, "default")
                dest = option_dest(node)
                if default is not None and is_cuda_string(default.value) and dest is not None:
                    options.setdefault(dest, []).append((node, default.value))
            elif isinstance(func, cst.Attribute) and func.attr.value in (*_PARSE_CALLS, *_PARSE_KNOWN):
                _seed(node, func.attr.value in _PARSE_KNOWN, stack, fn)
            elif isinstance(func, cst.Name):
                local_calls.setdefault(func.value, []).append((node, list(stack)))
        elif isinstance(node, cst.FunctionDef):
            if len(stack) == 2:  # a module-level function
                functions[node.name.value] = None if node.name.value in functions else node
            fn = node
        for child in children(node):
            visit(child, stack, fn)
        stack.pop()

    def _seed(call: cst.Call, known: bool, stack: list, fn: Optional[cst.FunctionDef]) -> None:
        parent = stack[-2] if len(stack) >= 2 else None
        if isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1:
            target = parent.targets[0].target
            if not known and isinstance(target, cst.Name):
                seeds.add(target.value)
                return
            if known and isinstance(target, (cst.Tuple, cst.List)) and target.elements \
                    and isinstance(target.elements[0].value, cst.Name):
                seeds.add(target.elements[0].value.value)
                return
        parses.append((call, known, list(stack), fn))

    visit(ctx.module, [], None)
    if not options:
        return {}
    dests = set(options)
    reads: dict[str, list[str]] = {d: [] for d in dests}
    namespaces: set[str] = set()
    work = list(seeds)
    if not seeds and not parses:
        blocked.append("no `parse_args()` in this file: the options are read elsewhere")

    def add(name: str) -> None:
        if name not in namespaces and name not in work:
            work.append(name)

    def whole(expr: cst.CSTNode, above: list, fn: Optional[cst.FunctionDef], as_dict: bool) -> None:
        """A use of the whole namespace ``expr`` (its ancestors: ``above``, innermost last)."""
        parent = above[-1] if above else None
        grand = above[-2] if len(above) >= 2 else None
        if isinstance(parent, cst.Arg) and parent.value is expr and isinstance(grand, cst.Call):
            qual = ctx.qualname(grand.func) or ""
            if not parent.star and not as_dict and qual == "builtins.vars" and len(grand.args) == 1:
                whole(grand, above[:-2], fn, True)
                return
            if not parent.star and qual in NAMESPACE_FUNCTIONS:
                return
            if not parent.star and not as_dict and qual in ("builtins.getattr", "builtins.setattr", "builtins.hasattr") \
                    and grand.args[0] is parent and len(grand.args) >= 2:
                attr = string_value(grand.args[1].value)
                if attr is not None and (attr not in dests or qual == "builtins.hasattr"):
                    return  # another option, by name
            if not parent.star and not as_dict and isinstance(grand.func, cst.Name) and functions.get(grand.func.value):
                param = _bound_param(functions[grand.func.value], grand, parent)
                if param is not None:
                    add(param)
                    return
            blocked.append(f"`{_quote(grand)}` gets the parsed options")
            return
        if isinstance(parent, cst.FormattedStringExpression):
            return
        if isinstance(parent, cst.Assign) and parent.value is expr and not as_dict and len(parent.targets) == 1 \
                and isinstance(parent.targets[0].target, cst.Name):
            add(parent.targets[0].target.value)
            return
        index: Optional[int] = None
        ret = None
        if isinstance(parent, cst.Return):
            ret = parent
        elif isinstance(parent, cst.Element) and isinstance(grand, cst.Tuple) and len(above) >= 3 \
                and isinstance(above[-3], cst.Return) and not isinstance(parent, cst.StarredElement):
            ret, index = above[-3], grand.elements.index(parent)
        if ret is not None and not as_dict and fn is not None and functions.get(fn.name.value) is fn:
            for call, stack in local_calls.get(fn.name.value, []):
                _returned(call, stack, index)
            return
        blocked.append(f"`{_quote(parent if parent is not None else expr)}`")

    def _returned(call: cst.Call, stack: list, index: Optional[int]) -> None:
        parent = stack[-2] if len(stack) >= 2 else None
        if isinstance(parent, cst.Assign) and parent.value is call and len(parent.targets) == 1:
            target = parent.targets[0].target
            if index is None and isinstance(target, cst.Name):
                add(target.value)
                return
            if index is not None and isinstance(target, (cst.Tuple, cst.List)) \
                    and not any(isinstance(e, cst.StarredElement) for e in target.elements) \
                    and index < len(target.elements) and isinstance(target.elements[index].value, cst.Name):
                add(target.elements[index].value.value)
                return
        blocked.append(f"`{_quote(parent if parent is not None else call)}`, the namespace returned")

    for call, known, stack, fn in parses:
        if known:
            blocked.append(f"`{_quote(call)}`, whose namespace porter does not follow")
        else:
            whole(call, stack[:-1], fn, False)
    while work:
        name = work.pop()
        namespaces.add(name)
        for node, stack, fn in occurrences.get(name, []):
            if _is_store(node, stack):
                continue
            if fn is not None and any(isinstance(s, cst.Param) and s.name.value == name
                                      for s in (fn.params.star_arg, fn.params.star_kwarg)):
                continue  # `*args` of a function: another object
            parent = stack[-2] if len(stack) >= 2 else None
            if isinstance(parent, cst.Attribute) and parent.value is node:
                attr = parent.attr.value
                if attr in dests:
                    grand = stack[-3] if len(stack) >= 3 else None
                    if isinstance(grand, cst.AssignTarget) and grand.target is parent:
                        continue  # the option set anew
                    kind, _ = classify_read(parent, stack[:-1], ctx)  # type: ignore[arg-type]
                    if kind not in ("device", "text") or reads_type(stack[:-1], ctx):
                        follows = derived_blocker(ctx, stack[:-1])
                        if follows == "" and isinstance(grand, cst.Assign) and grand.value is parent:
                            # `device_name = args.device`: the option itself where it is read, and only
                            # as a device; unread here, another module may import it
                            if any(derived_reads((grand, stack[:-2]))):
                                continue
                            follows = None
                        quote = f"`{_quote(_context(stack[:-1]))}`"
                        reads[attr].append(Derived(quote) if follows == "" else follows or quote)
                elif attr == "__dict__":
                    whole(parent, stack[:-2], fn, True)
                continue
            whole(node, stack[:-1], fn, False)

    out: dict = {}
    for dest, found in options.items():
        for call, default in found:
            out[default] = (call, tuple([*reads[dest], *blocked]))
    return out


def option_default_fact(ctx: FileContext) -> dict:
    """``add_argument``'s CUDA ``default=`` node -> (the ``add_argument`` call, the reads of the
    option, or uses of the namespace, that are not device uses or text, quoted)."""
    return module_fact(ctx, _option_walk)


def option_blocker(ctx: FileContext, default: cst.CSTNode, device: str) -> Optional[str]:
    """For a CUDA ``default=`` of ``add_argument``: "" where every read of the option is a
    device use or text and ``device`` may replace the default (``choices=`` has it, where
    there are choices), else the first read (or use of the namespace) that is not, quoted;
    None where porter does not know the option (no literal ``dest``)."""
    found = option_default_fact(ctx).get(default)
    if found is None:
        return None
    call, reasons = found
    choices = arg(call, "choices")
    if choices is not None and f"'{device}'" not in code(choices) and f'"{device}"' not in code(choices):
        return f"`choices={_quote(choices.value)}` has no '{device}'"
    if device == "cpu":  # a device type derived from the device follows it to 'cpu'
        reasons = tuple(r for r in reasons if not isinstance(r, Derived))
    return reasons[0] if reasons else ""


def device_string(value: str, like: cst.CSTNode) -> cst.SimpleString:
    """The device string ``value`` in the quotes of the string it replaces."""
    quote = '"'
    if isinstance(like, cst.SimpleString) and like.quote in ('"', "'"):
        quote = like.quote
    elif isinstance(like, cst.FormattedString) and like.end in ('"', "'"):
        quote = like.end
    return cst.SimpleString(f"{quote}{value}{quote}")


# --------------------------------------------------------------------------------------
# A script's module-level device string
# --------------------------------------------------------------------------------------
# ``device = 'cuda'  # examples: 'cpu', 'cuda', 'cuda:0'`` at a script's top level (nanoGPT's
# configuration style: globals a config file or the command line may override before they are
# read): the same question as for an option's default, asked of every read of the global name
# in the file (functions that bind the name themselves, without ``global``, read another
# variable). The string is a device string where its name says so (``device``, ``dev``,
# ``*_device``) or a read of it is a device use.


def _is_device_name(name: str) -> bool:
    last = name.lower()
    return last in ("device", "dev") or last.endswith("device")


def _module_string_walk(ctx: FileContext) -> dict:
    candidates: dict[str, list] = {}  # name -> [the CUDA string node of each top-level `name = '...'`]
    for stmt in ctx.module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name) \
                    and is_cuda_string(small.value):
                candidates.setdefault(small.targets[0].target.value, []).append(small.value)
    if not candidates:
        return {}
    reads: dict[str, list] = {n: [] for n in candidates}  # name -> [(kind, quoted context)]

    def shadowed(fn: cst.FunctionDef) -> set[str]:
        declared = {n.name.value for node in children_walk(fn) if isinstance(node, cst.Global) for n in node.names}
        return {n for n in function_locals(fn) if n in candidates and n not in declared}

    def visit(node: cst.CSTNode, stack: list, hidden: frozenset) -> None:
        stack.append(node)
        if isinstance(node, (cst.FunctionDef, cst.Lambda)):
            if isinstance(node, cst.FunctionDef):
                hidden = hidden | shadowed(node)
            else:
                hidden = hidden | {p.name.value for p in _lambda_params(node)}
        if isinstance(node, cst.Name) and node.value in candidates and node.value not in hidden \
                and not _is_store(node, stack):
            kind, _ = classify_read(node, stack, ctx)
            quote = f"`{_quote(_context(stack))}`"
            if kind not in ("device", "text") or reads_type(stack, ctx):
                follows = derived_blocker(ctx, list(stack))
                kind, quote = ("derived", quote) if follows == "" else (OTHER_USE, follows or quote)
            reads[node.value].append((kind, quote))
        for child in children(node):
            visit(child, stack, hidden)
        stack.pop()

    visit(ctx.module, [], frozenset())
    out: dict = {}
    for name, values in candidates.items():
        found = reads[name]
        if not _is_device_name(name) and not any(kind == "device" for kind, _ in found):
            continue
        blockers = tuple(Derived(quoted) if kind == "derived" else quoted for kind, quoted in found
                         if kind not in ("device", "text"))
        for value in values:
            out[value] = (name, blockers)
    return out


def _lambda_params(node: cst.Lambda):
    p = node.params
    return [*p.posonly_params, *p.params, *p.kwonly_params,
            *([p.star_arg] if isinstance(p.star_arg, cst.Param) else []), *([p.star_kwarg] if p.star_kwarg else [])]


def children_walk(node: cst.CSTNode):
    """Every node under ``node`` (itself included), nested functions too."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        todo.extend(children(n))


def module_string_blocker(ctx: FileContext, value: cst.CSTNode, device: str = "cpu") -> Optional[tuple[str, str]]:
    """For a CUDA string assigned to a name at the module's top level (``device = 'cuda'``):
    (the name, "") where every read of the global name in the file is a device use or text,
    else (the name, the first read that is not, quoted); None where the string is not a
    device string porter knows (its name is not a device's and no read is a device use)."""
    found = module_fact(ctx, _module_string_walk).get(value)
    if found is None:
        return None
    name, reasons = found
    if device == "cpu":  # a device type derived from the device follows it to 'cpu'
        reasons = tuple(r for r in reasons if not isinstance(r, Derived))
    return name, (reasons[0] if reasons else "")


def _flag_walk(ctx: FileContext) -> dict:
    """dest -> its default, for the file's boolean flags (`add_argument(..., action='store_true')`
    and 'store_false', with a literal `default=` where one is given); None for a dest declared
    twice with different defaults."""
    flags: dict = {}
    for node in walk(ctx.module, into_functions=True):
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value == "add_argument"):
            continue
        action = arg(node, "action")
        kind = string_value(action.value) if action is not None else None
        if kind not in ("store_true", "store_false"):
            continue
        dest = option_dest(node)
        default = arg(node, "default")
        if default is None:
            value: Optional[bool] = kind == "store_false"
        elif isinstance(default.value, cst.Name) and default.value.value in ("True", "False"):
            value = default.value.value == "True"
        else:
            value = None
        if dest is not None:
            flags[dest] = value if flags.get(dest, value) == value else None
    return flags


def default_truth(test: cst.CSTNode, ctx: FileContext) -> Optional[bool]:
    """The value of an `if` test when the script runs with its default flags: `args.cuda` of a
    `store_true` option is False, `not args.no_cuda` True, `and`/`or`/`not` of such tests as
    Python evaluates them; None where the test reads anything else (an availability check, an
    option that is not a flag of this file)."""
    return _default_truth(test, ctx, named=False)


# availability tests: on the GPU host the script was written for, true
_AVAILABILITY = ("torch.cuda.is_available", "torch.backends.mps.is_available", "torch.accelerator.is_available")


def _default_truth(test: cst.CSTNode, ctx: FileContext, named: bool) -> Optional[bool]:
    """default_truth; ``named``: ``test`` is the value of a flag variable the choice reads
    (`use_cuda = args.cuda and torch.cuda.is_available()`), where an availability test is
    true (the GPU host the script was written for) and decides nothing by itself."""
    if isinstance(test, cst.Attribute):
        value = module_fact(ctx, _flag_walk).get(test.attr.value)
        return value if isinstance(test.value, cst.Name) else None
    if isinstance(test, cst.Name) and not named:
        value = _bound_once(ctx, test.value)
        return None if value is None else _default_truth(value, ctx, named=True)
    if named and isinstance(test, cst.Call) and not test.args and ctx.qualname(test.func) in _AVAILABILITY:
        return True
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _default_truth(test.expression, ctx, named)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation):
        left, right = _default_truth(test.left, ctx, named), _default_truth(test.right, ctx, named)
        if named and (left is True and right is True):
            # a flag variable that is only availability: no user flag decides it
            return True if _reads_a_flag(test, ctx) else None
        if isinstance(test.operator, cst.And):
            return False if False in (left, right) else None if None in (left, right) else True
        return True if True in (left, right) else None if None in (left, right) else False
    return None


def _reads_a_flag(test: cst.CSTNode, ctx: FileContext) -> bool:
    flags = module_fact(ctx, _flag_walk)
    return any(isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.attr.value in flags
               for n in walk(test))


def _bound_once(ctx: FileContext, name: str) -> Optional[cst.BaseExpression]:
    """The one value the plain name ``name`` is given where the current node reads it (see
    porter.astutil.name_values); None where it may hold more than one, or what the code does
    not show."""
    values = name_values(ctx, name)
    return values[0] if values is not None and len(values) == 1 else None
