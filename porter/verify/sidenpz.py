"""The arrays of the side protocol, the same for every side (``side_torch``, ``side_jax``,
``side_mxnet``): one .npz file a side, read by ``porter.verify.compare``.

The original's side writes what both sides start from: ``init/<name>`` (the weights, by
torch's ``state_dict`` names), ``input/<i>`` with ``n_inputs``, and ``projection/<i>`` (the
fixed random projection of each output that makes the loss). The port's side reads them
(``Shared``) instead of making its own. Both then record, in this order: ``layer/<module>``
(every module's output of the first forward, in execution order), ``output/<i>``,
``grad/<name>``, and per optimizer step ``step<k>/loss``, ``step<k>/param/<name>``,
``step<k>/buffer/<name>``; the metadata's ``order`` is that recording order, the order the
comparison walks. Imports: numpy only (the MXNet venv has numpy 1.23.5, no torch or jax).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Optional

import numpy as np

from porter.verify import sideproto


def layer_key(name: str, suffix: str) -> str:
    """The key of one array of a module's output (``suffix``: its path in the output)."""
    return f"layer/{name}{'.' + suffix if suffix else ''}"


def output_key(suffix: str) -> str:
    return f"output/{suffix or '0'}"


class Arrays:
    """The arrays one side writes: ``put`` for what both sides start from (not compared in
    order), ``keep`` for what is compared, in the order recorded."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.order: list[str] = []

    def put(self, key: str, value: np.ndarray) -> None:
        self.arrays[key] = value

    def keep(self, key: str, value: np.ndarray) -> None:
        self.arrays[key] = value
        if key not in self.order:
            self.order.append(key)

    def put_inputs(self, inputs: Iterable[np.ndarray]) -> None:
        inputs = list(inputs)
        for i, x in enumerate(inputs):
            self.put(f"input/{i}", x)
        self.put("n_inputs", np.array(len(inputs)))

    def put_projection(self, shapes: Iterable[tuple], seed: int) -> list[np.ndarray]:
        """A new projection for outputs of ``shapes`` (standard normal, float32, drawn from the
        request's seed + 1), put and returned."""
        rng = np.random.default_rng(seed + 1)
        projection = [rng.standard_normal(tuple(shape)).astype("float32") for shape in shapes]
        for i, w in enumerate(projection):
            self.put(f"projection/{i}", w)
        return projection

    def save(self, path: str, meta: dict) -> None:
        """Write the arrays to ``path`` and the recording order into ``meta``."""
        meta["order"] = self.order
        np.savez(path, **self.arrays)


class Shared:
    """What the original's side wrote, as the port's side reads it."""

    def __init__(self, path: str) -> None:
        self.data = np.load(path)
        self.files: list[str] = list(self.data.files)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.data[key]

    def state(self) -> dict[str, np.ndarray]:
        """The initial weights, by name (``init/`` taken off)."""
        return {k[len("init/"):]: self.data[k] for k in self.files if k.startswith("init/")}

    def inputs(self) -> list[np.ndarray]:
        return [self.data[f"input/{i}"] for i in range(int(self.data["n_inputs"]))]

    def projection(self, n: Optional[int] = None) -> list[np.ndarray]:
        """The first ``n`` arrays of the projection (all of them when ``n`` is None)."""
        if n is None:
            n = sum(1 for k in self.files if k.startswith("projection/"))
        return [self.data[f"projection/{i}"] for i in range(n)]


def mismatch(own: Mapping[str, Optional[tuple]], state: Mapping[str, tuple]) -> Optional[dict]:
    """The metadata's record of weights that do not fit, or None: ``own`` and ``state`` are the
    port's and the shared weights' shapes by name (None: a lazy parameter with no shape yet,
    which loading gives one)."""
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing or extra:
        return {"missing": missing, "unexpected": extra}
    bad = {k: shape for k, shape in own.items() if shape is not None and tuple(shape) != tuple(state[k])}
    if bad:
        return {"shape": {k: [list(state[k]), list(shape)] for k, shape in bad.items()}}
    return None


def request_inputs(request: dict, ns: dict, to_numpy: Callable[[Any], np.ndarray]) -> list[np.ndarray]:
    """The original's inputs when nothing is shared: generated from the request's ``--input``
    specs (seeded by the request's seed), else the file's ``example_inputs()``."""
    if request.get("inputs"):
        from porter.verify.specs import InputSpec

        rng = np.random.default_rng(request["seed"])
        return [InputSpec.parse(s).generate(rng) for s in request["inputs"]]
    if callable(ns.get("example_inputs")):
        return [to_numpy(x) for x in sideproto.as_tuple(ns["example_inputs"]())]
    raise RuntimeError("no --input given and the original defines no example_inputs()")
