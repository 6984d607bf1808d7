"""The port fixtures: ``fixtures/<target>/<name>/train.py`` (the original), ``expected.py``
(porter's port, reviewed and compared byte for byte) and ``port.toml`` (how the port is made
and run). The MXNet/Gluon originals in ``fixtures/mxnet/<name>/`` are ported to both targets:
``expected_torch_xla.py`` and ``expected_jax.py`` beside the original (:func:`gluon_fixtures`).
``python -m porter.fixtures`` rewrites every expected file from the current rules."""
from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from porter import engine, registry
from porter._layout import REPO


@dataclass(frozen=True)
class Fixture:
    name: str
    folder: Path
    target: str  # "torch-xla", "jax": the rules that make expected.py
    migrate: tuple[str, ...]
    run: tuple[str, ...]
    log_interval: int
    optimizer_steps_per_iteration: int
    original_runs_on: str = "cuda"  # "cuda": a GPU script; "xla-legacy": already on an older torch_xla; "mxnet": a Gluon script
    warmup_iterations: int = 2  # iterations allowed to compile (the step, then the step with optimizer state)
    # Unsafe fixes whose change of semantics the comparison accepts: the reference run is the
    # original with only these rules applied (e.g. TX302 drop_last shortens an epoch, which a
    # schedule built from len(loader) sees; TX902 SparseAdam -> Adam updates absent rows).
    reference_rules: tuple[str, ...] = ()
    # model-level verification (`porter verify ORIGINAL PORT --model EXPR --input SPEC...`)
    model: str = ""
    inputs: tuple[str, ...] = ()
    expected_name: str = "expected.py"  # a Gluon original's ports: expected_<target>.py
    # samples in each synthetic dataset of the whole-epoch comparison run (None: the verifier's
    # default); a fixture whose steps are costly asks for fewer, enough for its checked steps
    synthetic_size: int | None = None

    @property
    def original(self) -> Path:
        return self.folder / "train.py"

    @property
    def expected(self) -> Path:
        return self.folder / self.expected_name

    @property
    def unsafe(self) -> bool:
        return "--unsafe-fixes" in self.migrate

    def reference(self) -> str:
        """The original with only ``reference_rules`` applied: what the port must match."""
        source = self.original.read_text(encoding="utf-8")
        if not self.reference_rules:
            return source
        options = engine.Options(registry.select(self.target, self.reference_rules), unsafe_fixes=True)
        return engine.fix(source, options, str(self.original)).source

    def port(self) -> str:
        options = engine.Options(registry.select(self.target), unsafe_fixes=self.unsafe)
        return engine.fix(self.original.read_text(encoding="utf-8"), options, str(self.original)).source


def _fixture(conf: Path, target: str, expected_name: str = "expected.py", runs_on: str = "cuda") -> Fixture:
    data = tomllib.loads(conf.read_text(encoding="utf-8"))
    return Fixture(conf.parent.name, conf.parent, target, tuple(data.get("migrate", [])),
                   tuple(data.get("run", [])),
                   int(data.get("log_interval", 5)), int(data.get("optimizer_steps_per_iteration", 1)),
                   str(data.get("original_runs_on", runs_on)), int(data.get("warmup_iterations", 2)),
                   tuple(data.get("reference_rules", ())), str(data.get("model", "")),
                   tuple(data.get("inputs", ())), expected_name,
                   int(data["synthetic_size"]) if "synthetic_size" in data else None)


def fixtures(target: str = "torch-xla") -> list[Fixture]:
    """The fixtures of one target, from ``fixtures/<target with _ for ->/*/port.toml``."""
    return [_fixture(conf, target) for conf in sorted((REPO / "fixtures" / target.replace("-", "_")).glob("*/port.toml"))]


GLUON_TARGETS = ("torch-xla", "jax")


def gluon_fixtures(target: str = "torch-xla") -> list[Fixture]:
    """The MXNet/Gluon originals (``fixtures/mxnet/*/port.toml``) as fixtures of ``target``
    (torch-xla or jax): the port is ``expected_<target with _ for ->.py`` beside the original;
    port.toml's ``migrate`` options apply to both targets."""
    if target not in GLUON_TARGETS:
        raise ValueError(f"Gluon originals are ported to {', '.join(GLUON_TARGETS)}, not {target!r}")
    name = f"expected_{target.replace('-', '_')}.py"
    return [_fixture(conf, target, name, "mxnet") for conf in sorted((REPO / "fixtures" / "mxnet").glob("*/port.toml"))]


def main() -> None:
    every = [fx for target in registry.TARGETS for fx in fixtures(target)]
    every += [fx for target in GLUON_TARGETS for fx in gluon_fixtures(target)]
    for fx in every:
        text = fx.port()
        old = fx.expected.read_text(encoding="utf-8") if fx.expected.exists() else None
        if text != old:
            fx.expected.write_text(text, encoding="utf-8")
            print(f"updated {fx.expected.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
