"""Which models a zoo holds, and the inputs each one takes.

Run in the interpreter of the zoo's framework (``python -m porter.zoo.discover REQUEST.json``:
the main venv for torch zoos, the MXNet venv for Gluon zoos), because finding a zoo's models
means importing it. Standard library at the top: the MXNet venv has neither torch nor jax.

A model is ``(name, module, expr, inputs)``: ``expr`` is evaluated in ``module``'s namespace to
build it (``resnet18()``), ``inputs`` are verify input specs (``float32[2,3,224,224]``).
Where they come from, first that applies:

1. ``--model MODULE:EXPR`` given by the user;
2. the zoo's own registry, recognised by what the package exposes:
   ``list_models`` + ``get_model_builder`` (torchvision), ``list_models`` + ``create_model``
   (timm), ``get_model`` + ``get_model_list`` (gluoncv) or a ``get_model`` beside a name ->
   constructor table (mxnet's Gluon model zoo); each name is resolved to the function the
   registry would call, so the model's own module is known;
3. every public function (one that returns a value) and model class defined in the package's
   modules that can be called with no arguments and gives a model (nn.Module / HybridBlock).

Inputs: the user's ``--input``, else the model's metadata (timm's ``pretrained_cfg``,
torchvision weights' ``transforms().crop_size``, Gluon names: CIFAR 32, Inception 299, else
224), else the first shape on which one forward of the built model runs (batch 1, eval mode,
no gradients), smallest first (a model verifies faster on a small input): the width of its
first Linear, its first Conv2d's channels at 32, 28, 224 and 299 pixels, then 3x32x32,
1x28x28, 3x224x224, 3x299x299.

A smaller image (``image_size`` in the request, ``porter zoo --image-size N``): a torch model
whose input is one image (C x H x W) is verified at the smallest of N, 2N, 4N, ... below its
own size on which a training-mode forward of batch 2 runs, else at its own size. The model is
built and run on the meta device (shapes only: no memory, no arithmetic) where its constructor
allows, else with its parameters and buffers put on the meta device as they are registered, so a model that only takes its own size (a ViT's fixed patch grid,
maxvit's 7x7 windows) or needs more pixels (inception_v3's auxiliary head in training) keeps it. The model's layers are the same at any size; only the spatial
extent of each activation changes.
"""
from __future__ import annotations

import fnmatch
import importlib
import inspect
import json
import pkgutil
import sys
import traceback
from pathlib import Path

BATCH = 2
# smallest first: a model that takes a small image verifies faster on it
PROBES = ((3, 32, 32), (1, 28, 28), (3, 224, 224), (3, 299, 299))


def _spec(shape) -> list:
    return [f"float32[{BATCH},{','.join(str(int(s)) for s in shape)}]"]


def _is_model_class(obj) -> bool:
    for modname, cls in (("torch.nn", "Module"), ("mxnet.gluon", "HybridBlock")):
        base = sys.modules.get(modname)
        if base is not None and isinstance(obj, type) and issubclass(obj, getattr(base, cls)):
            return True
    return False


def _no_required_args(fn) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return all(p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in sig.parameters.values())


def _returns_value(fn) -> bool:
    """Whether a function's own body returns a value (a factory does; a ``test()`` that builds a
    model and prints its output does not, and is never called)."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return True
    body = tree.body[0]
    todo = list(getattr(body, "body", []))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return) and node.value is not None:
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def _modules(package) -> list:
    """The package and every module under it that imports (one that does not is skipped and
    named in ``skipped``)."""
    mods, skipped = [package], []
    for info in pkgutil.walk_packages(getattr(package, "__path__", []), package.__name__ + "."):
        try:
            mods.append(importlib.import_module(info.name))
        except Exception as exc:  # noqa: BLE001 - a module that does not import is not a zoo's model
            skipped.append({"module": info.name, "error": f"{type(exc).__name__}: {exc}"})
    return mods, skipped


# --- registries --------------------------------------------------------------------------


def _torchvision_like(pkg) -> "list | None":
    if not (callable(getattr(pkg, "list_models", None)) and callable(getattr(pkg, "get_model_builder", None))):
        return None
    out = []
    try:
        names = pkg.list_models(module=pkg)
    except TypeError:
        names = pkg.list_models()
    for name in names:
        fn = pkg.get_model_builder(name)
        inputs, cost = _torchvision_inputs(pkg, name)
        out.append({"name": name, "module": fn.__module__, "expr": f"{fn.__name__}()", "inputs": inputs, "cost": cost})
    return out


def _torchvision_inputs(pkg, name) -> tuple:
    """The input of the first weights' transforms (crop size), and the weights' cost metadata
    (GFLOPs per image at that size, else the parameter count), or ([], None)."""
    try:
        weights = pkg.get_model_weights(name)
        first = next(iter(weights))
        crop = first.transforms().crop_size
        size = crop[0] if isinstance(crop, (list, tuple)) else crop
    except Exception:  # noqa: BLE001 - no weights enum: probe the model
        return [], None
    meta = getattr(first, "meta", None) or {}
    cost = meta.get("_ops") or (meta.get("num_params") or 0) / 1e9 or None
    return _spec((3, size, size)), (float(cost) if isinstance(cost, (int, float)) else None)


def _timm_like(pkg) -> "list | None":
    if not (callable(getattr(pkg, "list_models", None)) and callable(getattr(pkg, "create_model", None))):
        return None
    registry = importlib.import_module(pkg.__name__ + ".models")
    out = []
    for name in pkg.list_models():
        lookup = getattr(registry, "model_entrypoint", None) or getattr(registry, "get_model_entrypoint", None)
        try:
            fn = lookup(name) if lookup else None
        except Exception:  # noqa: BLE001 - a listed name without an entry point
            fn = None
        if fn is None:
            continue
        inputs = []
        cfg = registry.get_pretrained_cfg(name) if hasattr(registry, "get_pretrained_cfg") else None
        size = getattr(cfg, "input_size", None)
        if size:
            inputs = _spec(size)
        out.append({"name": name, "module": fn.__module__, "expr": f"{fn.__name__}(pretrained=False)", "inputs": inputs})
    return out


def _gluon_inputs(name: str) -> list:
    low = name.lower()
    if "cifar" in low:
        return _spec((3, 32, 32))
    if "inception" in low:
        return _spec((3, 299, 299))
    return _spec((3, 224, 224))


def _literal_table(fn, owner) -> "dict | None":
    """A ``{'name': constructor, ...}`` literal in FN's body (names of its module), as a dict."""
    import ast
    import textwrap

    if owner is None:
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and len(node.keys) > 3 and all(
                isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys) and all(
                isinstance(v, ast.Name) for v in node.values):
            table = {k.value: getattr(owner, v.id, None) for k, v in zip(node.keys, node.values)}
            if all(callable(f) for f in table.values()):
                return table
    return None


def _gluon_like(pkg) -> "list | None":
    get_model = getattr(pkg, "get_model", None)
    if not callable(get_model):
        return None
    table = None
    if callable(getattr(pkg, "get_model_list", None)):  # gluoncv: the names; the table is get_model's module's
        names = list(pkg.get_model_list())
        owner = sys.modules.get(get_model.__module__)
        table = next((v for v in vars(owner).values() if isinstance(v, dict) and set(names) <= set(v)), None) if owner else None
    else:  # mxnet's model zoo: a name -> constructor table in get_model's module, or in its body
        owner = sys.modules.get(get_model.__module__)
        table = next((v for v in vars(owner).values() if isinstance(v, dict) and len(v) > 3 and all(callable(f) for f in v.values())), None) if owner else None
        table = table or _literal_table(get_model, owner)
        names = list(table or ())
    if not table:
        return None
    out = []
    for name in names:
        fn = table.get(name)
        if fn is None or not hasattr(fn, "__module__"):
            continue
        expr = f"{fn.__name__}()" if inspect.isfunction(fn) or isinstance(fn, type) else None
        if expr is None or getattr(sys.modules.get(fn.__module__), fn.__name__, None) is not fn:
            continue
        out.append({"name": name, "module": fn.__module__, "expr": expr, "inputs": _gluon_inputs(name)})
    return out


REGISTRIES = (("torchvision-like", _torchvision_like), ("timm-like", _timm_like), ("gluon-like", _gluon_like))


# --- no registry: what can be built with no arguments -------------------------------------


def _candidates(mods) -> list:
    out, seen = [], set()
    for mod in mods:
        for attr, obj in sorted(vars(mod).items()):
            if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if not (_is_model_class(obj) or (inspect.isfunction(obj) and _returns_value(obj))) or not _no_required_args(obj):
                continue
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            out.append({"name": f"{mod.__name__.split('.')[-1]}.{attr}" if mod.__name__ != mods[0].__name__ else attr,
                        "module": mod.__name__, "expr": f"{attr}()", "inputs": []})
    return out


def _build(entry):
    mod = importlib.import_module(entry["module"])
    return eval(entry["expr"], vars(mod))  # the zoo's own constructor, in its own module


def _shapes(first) -> list:
    """Probe shapes: those the model's first layer takes (a Linear's width, a Conv2d's
    channels at the usual image sizes), then the usual images."""
    out = []
    if first is not None and getattr(first, "in_features", None):
        out.append((int(first.in_features),))
    elif first is not None and getattr(first, "in_channels", None):
        out += [(int(first.in_channels), size, size) for size in (32, 28, 224, 299)]
    return list(dict.fromkeys(out + list(PROBES)))


def _probe(model) -> list:
    """The first probe shape on which one forward runs (batch 1, eval, no gradients)."""
    if "torch" in sys.modules and isinstance(model, sys.modules["torch"].nn.Module):
        import torch

        model.eval()
        first = next((m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))), None)
        for shape in _shapes(first):
            try:
                with torch.no_grad():
                    model(torch.zeros((1, *shape)))
                return _spec(shape)
            except Exception:  # noqa: BLE001 - not this shape
                continue
    elif "mxnet" in sys.modules:
        import mxnet as mx

        try:
            model.initialize()
        except Exception:  # noqa: BLE001 - already initialised
            pass
        for shape in _shapes(None):
            try:
                model(mx.nd.zeros((1, *shape))).wait_to_read()
                return _spec(shape)
            except Exception:  # noqa: BLE001
                continue
    return []


def _image_of(spec: str):
    """(prefix, channels, size) of a ``float32[B,C,S,S]`` spec, else None."""
    head, sep, dims = spec.partition("[")
    parts = dims.rstrip("]").split(",") if sep else []
    if len(parts) != 4 or parts[2] != parts[3] or not all(p.strip().isdigit() for p in parts):
        return None
    return head, int(parts[1]), int(parts[2])


def _built_for_probe(entry):
    """The model built on the meta device (shapes only), else, where its constructor computes
    with real tensors (regnet's widths), with only its parameters and buffers put on the meta
    device as they are registered (each made on the CPU uninitialized, then dropped); None when
    it does not build."""
    import torch

    try:
        with torch.device("meta"):
            return _build(entry)
    except Exception:  # noqa: BLE001 - not with every tensor on the meta device
        pass
    module = torch.nn.Module
    register_parameter, register_buffer = module.register_parameter, module.register_buffer

    def parameter(self, name, param):
        if param is not None and param.device.type != "meta":
            param = type(param)(param.detach().to("meta"), requires_grad=param.requires_grad)
        return register_parameter(self, name, param)

    def buffer(self, name, tensor, persistent=True):
        return register_buffer(self, name, None if tensor is None else tensor.to("meta"), persistent)

    module.register_parameter, module.register_buffer = parameter, buffer
    try:
        return _build(entry)
    except Exception:  # noqa: BLE001 - verify reports a model that does not build
        return None
    finally:
        module.register_parameter, module.register_buffer = register_parameter, register_buffer


def _runs_at(model, channels: int, size: int) -> bool:
    """Whether a training-mode forward of a batch of BATCH images of SIZE x SIZE runs."""
    import torch

    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    try:
        with torch.no_grad(), torch.device(device):  # tensors the forward makes: on the model's device
            model.train()
            model(torch.zeros((BATCH, channels, size, size)))
        return True
    except Exception:  # noqa: BLE001 - not at this size
        return False


def _smaller_image(entry, size: int) -> None:
    """Give a one-image torch model the smallest of SIZE, 2*SIZE, ... below its own size that it
    runs on (docstring above); keep its own size where none does."""
    if entry.get("framework") != "torch" or len(entry["inputs"]) != 1:
        return
    image = _image_of(entry["inputs"][0])
    if image is None or size >= image[2]:
        return
    head, channels, own = image
    model = _built_for_probe(entry)
    s = size
    while model is not None and s < own:
        if _runs_at(model, channels, s):
            entry["inputs"] = [f"{head}[{BATCH},{channels},{s},{s}]"]
            entry["image_size"] = {"own": own, "used": s}
            return
        s *= 2


def _chosen(name: str, globs) -> bool:
    return not globs or any(fnmatch.fnmatchcase(name, g) for g in globs)


def discover(request: dict) -> dict:
    package = request["package"]
    path = Path(package)
    if path.is_dir():
        sys.path.insert(0, str(path.resolve().parent))
        package = path.resolve().name
    pkg = importlib.import_module(package)
    root = Path(pkg.__file__).resolve().parent if getattr(pkg, "__file__", None) else Path(list(pkg.__path__)[0])
    result = {"package": pkg.__name__, "path": str(root), "registry": None, "models": [], "skipped": []}
    models = None
    if request.get("models"):
        models = [dict(m, inputs=[]) for m in request["models"]]
        result["registry"] = "--model"
    else:
        for kind, find in REGISTRIES:
            models = find(pkg)
            if models:
                result["registry"] = kind
                break
    if not models:
        mods, result["skipped"] = _modules(pkg)
        candidates = [c for c in _candidates(mods) if _chosen(c["name"], request.get("select"))]
        models = []
        for entry in candidates:  # keep what builds a model (and probe it now, built once)
            try:
                built = _build(entry)
            except Exception:  # noqa: BLE001 - a function that needs arguments after all, or is no factory
                continue
            if _is_model_class(type(built)):
                if not request.get("inputs") and request.get("probe", True):
                    entry["inputs"] = _probe(built)
                    entry["probed"] = True
                models.append(entry)
            del built
        result["registry"] = "factories"
    models = [m for m in models if _chosen(m["name"], request.get("select"))]  # only those are built and probed
    for entry in models:
        entry["framework"] = "mxnet" if "mxnet" in sys.modules and "torch" not in sys.modules else "torch"
        if request.get("inputs"):
            entry["inputs"] = list(request["inputs"])
        elif not entry["inputs"] and not entry.get("probed") and request.get("probe", True):
            try:
                entry["inputs"] = _probe(_build(entry))
            except Exception as exc:  # noqa: BLE001 - the original fails to build: verify says so
                entry["build_error"] = f"{type(exc).__name__}: {exc}"
        if request.get("image_size") and not request.get("inputs") and entry["inputs"]:
            _smaller_image(entry, int(request["image_size"]))
    result["models"] = models
    return result


def main(argv) -> int:
    request = json.loads(Path(argv[0]).read_text())
    try:
        result = discover(request)
    except BaseException as exc:  # noqa: BLE001 - reported to the zoo command, which says it clearly
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    Path(request["out"]).write_text(json.dumps(result))
    return 0 if "error" not in result else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
