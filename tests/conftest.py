"""Test lanes (markers from one table, the fast lane's tripwire) and the fixtures shared by the
test modules that run real MXNet (see mxnethelp.py).

Lanes: ``scripts/test`` runs everything; ``scripts/test --fast`` sets PORTER_TEST_NO_FRAMEWORKS=1,
under which the tests marked ``framework`` or ``slow`` are deselected and importing torch_xla,
JAX or MXNet, in the test process or in any Python subprocess, raises and fails the test
(tests/tripwire/). A
test that starts a framework is listed in FRAMEWORK_TESTS below (or carries the ``xla``,
``jax`` or ``mxnet`` marker itself); every one of them also gets ``framework``.
"""
from __future__ import annotations

import faulthandler
import fcntl
import fnmatch
import importlib.util
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

import mxnethelp
from porter.verify import warm

TESTS = Path(__file__).resolve().parent
TRIPWIRE = TESTS / "tripwire"
_spec = importlib.util.spec_from_file_location("porter_test_tripwire", TRIPWIRE / "sitecustomize.py")
tripwire = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tripwire)

FRAMEWORK_MARKERS = ("xla", "jax", "mxnet")
# Which tests start which framework, in this process or in subprocesses (porter verify's sides,
# fixture runs, MXNet originals). Keys are fnmatch patterns of node ids relative to tests/; a
# key without "::" is a whole module, which the fast lane does not even import (a module that
# imports a framework at the top must be listed whole).
FRAMEWORK_TESTS: dict[str, tuple[str, ...]] = {
    # whole modules: they import JAX at the top, or a module fixture runs torch_xla
    "test_jax_modules.py": ("jax",),
    "test_jax_modules_run.py": ("jax",),
    "test_jax_ops_run.py": ("jax",),
    "test_jax_optim.py": ("jax",),
    "test_jax_decay_groups.py": ("jax",),
    "test_jax_parameter_count.py": ("jax",),
    "test_jax_sampling.py": ("jax",),
    "test_jax_manual_lr.py": ("jax",),
    "test_verify_weights.py::test_a_model_whose_module_dict_holds_every_parameter_through_a_tied_head*": ("jax",),
    "test_jax_straight_line.py": ("jax",),  # JAX ports of autograd outside a loop, run and verified
    "test_jax_apply_init.py": ("jax",),
    "test_jax_tied_weights.py": ("jax",),  # tied embeddings ported and run against torch
    "test_jax_split_sizes.py": ("jax",),  # torch.split with run-time sizes, against torch
    "test_jax_torch_calls.py::test_the_port_runs_*": ("jax",),  # device barriers, torch.compile, the profiler ported and run
    "test_gluon_jax_models.py": ("jax",),
    "test_host_sync_run.py": ("xla",),
    "test_loop_rules_run.py": ("xla",),
    "test_static_shape_run.py": ("xla",),
    "test_scan_lstm_run.py": ("xla",),
    "test_precision_dist_run.py": ("xla",),
    "test_verify_mxnet.py": ("mxnet", "xla"),
    # script-level verify of Gluon originals: MXNet beside torch_xla and JAX ports
    "test_verify_script_mxnet.py": ("mxnet", "xla", "jax"),
    "test_gluon_zoo_blocks.py::test_port_matches_mxnet": ("mxnet", "xla"),
    "test_gluon_zoo_blocks.py::test_convolutions_bound_at_run_time_match_mxnet*": ("mxnet", "xla", "jax"),
    # a port reading its data from a local Cloud Storage emulator trains under torch_xla
    "test_gcs_data.py::test_port_trains_*": ("xla",),
    # the Colab kit's TPU check run with the real frameworks on the CPU
    "test_kits.py::test_device_check_runs_and_refuses_a_cpu*": ("xla", "jax"),
    "test_notebooks_run.py": ("xla",),  # Jupyter kernels (nbclient), the port on torch_xla
    "test_zoo.py": ("xla", "jax"),
    "test_zoo_torchvision.py": ("xla",),  # porter zoo on real torchvision builders, torch_xla
    "test_verify_reference.py": ("xla",),  # verify_model with the float64 reference, torch_xla ports
    "test_verify_jax_reference.py": ("jax",),  # verify --reference, Flax NNX ports
    "test_verify_jax_drop_paths.py": ("jax",),  # stochastic depth switched off on both sides
    # ports of fixtures/zoo run on XLA (torch_xla, JAX) beside the original
    "test_packages.py::test_torch_xla_port_*": ("xla",),
    "test_packages.py::test_jax_port_*": ("jax",),
    # JAX ports run (jitted steps, optax), and the MXNet originals they are compared with
    "test_gluon_jax_scripts.py::test_gluon_adam_optax_*": ("jax",),
    "test_gluon_jax_scripts.py::test_metrics_update_on_jax_arrays_*": ("jax",),
    "test_gluon_jax_scripts.py::test_custom_metric_*": ("jax",),
    "test_gluon_jax_scripts.py::test_script_steps_jax_port_*": ("jax", "mxnet"),
    "test_gluon_jax_scripts.py::test_jax_port_*": ("jax", "mxnet"),
    "test_gluon_jax_scripts.py::test_resnet_jax_port_*": ("jax",),
    "test_jax_fixtures.py::test_port_runs_*": ("jax",),
    "test_jax_fixtures.py::test_model_level_verification*": ("jax",),
    "test_jax_init.py::test_initial_values_*": ("jax",),
    "test_jax_init.py::test_emitted_fans_*": ("jax",),
    "test_jax_init.py::test_random_numbers_in_a_method_*": ("jax",),
    "test_jax_init.py::test_lambda_lr_port_prints_*": ("jax",),
    "test_jax_init.py::test_lambda_lr_lambda_becomes_a_traceable_schedule": ("jax",),
    "test_jax_loop.py::test_*_runs_and_matches_pytorch": ("jax",),
    "test_jax_loop.py::test_state_carried_across_steps": ("jax",),
    "test_verify_jax.py::test_host_callbacks_*": ("jax",),
    "test_verify_jax.py::test_nnx_paths_*": ("jax",),
    "test_verify_jax.py::test_channels_last_*": ("jax",),
    "test_verify_jax.py::test_optax_*": ("jax",),
    "test_verify_jax.py::test_mlp_port_*": ("jax",),
    "test_verify_jax.py::test_cnn_port_*": ("jax",),
    "test_verify_jax.py::test_flax_*": ("jax",),
    "test_verify_jax.py::test_plain_nnx_*": ("jax",),
    "test_verify_jax.py::test_a_torch_module_without_*": ("jax",),
    "test_verify_jax.py::test_a_python_attribute_*": ("jax",),
    "test_verify_jax.py::test_a_host_read_*": ("jax",),
    "test_verify_jax.py::test_a_port_without_*": ("jax",),
    "test_verify_jax.py::test_a_model_that_is_not_*": ("jax",),
    "test_verify_jax.py::test_random_numbers_of_the_forward_*": ("jax",),
    "test_verify_jax.py::test_noise_used_otherwise_*": ("jax",),
    "test_verify_jax.py::test_linear_kernel_*": ("jax",),
    "test_verify_jax.py::test_square_kernel_*": ("jax",),
    "test_verify_jax.py::test_outputs_of_another_shape_*": ("jax",),
    "test_verify_jax.py::test_debug_print_*": ("jax",),
    # MXNet originals (the MXNet venv), and the torch_xla / JAX ports compared with them
    "test_gluon_model_rules.py::test_more_layers_match_gluon*": ("mxnet",),
    "test_gluon_model_rules.py::test_ported_model_matches_gluon*": ("mxnet",),
    "test_gluon_model_rules.py::test_ported_model_runs_on_xla*": ("mxnet", "xla"),
    "test_gluon_model_rules.py::test_porter_verify_accepts_the_port*": ("mxnet", "xla"),
    "test_gluon_ops.py::test_op_matches_mxnet*": ("mxnet",),
    "test_gluon_datasets.py::test_port_trains_on_xla*": ("mxnet", "xla"),
    "test_gluon_datasets.py::test_jax_port_trains*": ("mxnet", "jax"),
    "test_gluon_record_blocks.py::test_the_port_trains*": ("mxnet", "xla"),
    "test_gluon_placement.py::test_the_script_of_these_spellings_trains*": ("mxnet", "xla"),
    # probability-label cross entropy and the regression / top-k metrics against MXNet, both ports
    "test_gluon_losses_metrics.py::test_torch_xla_port_matches_mxnet": ("mxnet",),
    "test_gluon_losses_metrics.py::test_jax_port_matches_mxnet_*": ("mxnet", "jax"),
    "test_gluon_losses_metrics.py::test_probability_labels_differ_*": ("mxnet",),
    # a script and its Gluon library ported with --with: MXNet original, torch_xla port
    "test_gluon_libraries.py::test_port_with_its_library_trains_as_mxnet": ("mxnet", "xla"),
    "test_gluon_ops.py::test_array_reshape_with_special_codes": ("mxnet",),
    "test_gluon_ports.py::test_script_port_takes_the_original_steps*": ("mxnet", "xla"),
    "test_gluon_ports.py::test_port_loads_the_originals_parameter_file*": ("mxnet", "xla", "jax"),
    "test_gluon_ports.py::test_verify_against_mxnet*": ("mxnet", "xla", "jax"),
    "test_gluon_ports.py::test_torch_xla_port_runs_healthy*": ("xla",),
    "test_gluon_script_rules.py::test_converter_reads_save_parameters_files*": ("mxnet",),
    "test_gluon_script_rules.py::test_converter_reads_other_dtypes*": ("mxnet",),
    "test_gluon_script_rules.py::test_converter_loads_into_torch_models*": ("mxnet",),
    "test_gluon_script_rules.py::test_gluon_adam_takes_mxnet_steps*": ("mxnet",),
    "test_gluon_script_rules.py::test_metrics_give_mxnet_values*": ("mxnet",),
    "test_mxnet_fixtures.py::test_original_trains*": ("mxnet",),
}


def _fast_lane() -> bool:
    return bool(os.environ.get(tripwire.ENV))


# JAX's persistent compilation cache, one per run of the suite (unless JAX_COMPILATION_CACHE_DIR
# names one): the JAX processes of the tests compile the same eager operations and often the
# same steps (a fixture's port run by several tests); every program is kept, however quick its
# compilation (the eager ops are many quick ones: a JAX fixture's run on the CPU 21 s with a
# cold cache, 7 s warm). A program loaded from the cache still counts as a compilation in the
# JAX side's health, and JAX_DUMP_IR_TO still gets its lowered module.
_JAX_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def _arm_watchdog() -> None:
    """PORTER_TEST_WATCHDOG=SECONDS (.ci/run sets it): a run still going after that long prints
    the stack of every thread of this process (the controller and each worker arm their own)
    and exits, so that a run that hangs says where instead of running into CI's own limit."""
    seconds = float(os.environ.get("PORTER_TEST_WATCHDOG") or 0)
    if seconds <= 0:
        return
    stream = os.fdopen(os.dup(2), "w")  # (the real stderr: pytest captures fd 2 during tests)

    def fire() -> None:
        print(f"\nporter tests: still running after {seconds:g} s (PORTER_TEST_WATCHDOG); the threads of "
              f"process {os.getpid()} ({os.environ.get('PYTEST_XDIST_WORKER', 'controller')}):", file=stream,
              flush=True)
        faulthandler.dump_traceback(file=stream, all_threads=True)
        stream.flush()
        os._exit(3)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()


def pytest_configure(config):
    _arm_watchdog()
    if _fast_lane():
        # every Python subprocess imports the tripwire too (as sitecustomize)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TRIPWIRE), os.environ.get("PYTHONPATH")) if p)
        tripwire.install()
    elif not hasattr(config, "workerinput") and not os.environ.get(_JAX_CACHE_ENV):
        # the workers and every subprocess inherit it
        config._porter_jax_cache = tempfile.mkdtemp(prefix="porter-test-jax-cache-")
        os.environ[_JAX_CACHE_ENV] = config._porter_jax_cache
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    if not _fast_lane() and not hasattr(config, "workerinput") and warm.DIR_VARIABLE not in os.environ:
        # verification sides start as forks of warm interpreters that imported torch once
        # (porter.verify.warm), shared by the workers and every porter process of the run
        config._porter_warm = tempfile.mkdtemp(prefix="porter-test-warm-")
        os.environ[warm.DIR_VARIABLE] = config._porter_warm
        os.environ["PORTER_WARM_OWNER"] = str(os.getpid())


def pytest_unconfigure(config):
    warm_folder = getattr(config, "_porter_warm", None)
    if warm_folder:
        warm.stop_all(warm_folder)
        shutil.rmtree(warm_folder, ignore_errors=True)
        if os.environ.get(warm.DIR_VARIABLE) == warm_folder:
            del os.environ[warm.DIR_VARIABLE]
    folder = getattr(config, "_porter_jax_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
        if os.environ.get(_JAX_CACHE_ENV) == folder:
            del os.environ[_JAX_CACHE_ENV]


def framework_markers(nodeid: str) -> set[str]:
    """The framework markers FRAMEWORK_TESTS gives the test ``nodeid`` (tests/-relative or not)."""
    rel = nodeid.split("tests/", 1)[1] if nodeid.startswith("tests/") else nodeid
    module = rel.split("::", 1)[0]
    return {m for pattern, marks in FRAMEWORK_TESTS.items()
            if fnmatch.fnmatchcase(rel if "::" in pattern else module, pattern) for m in marks}


def pytest_ignore_collect(collection_path, config):
    # the fast lane does not import a module that is framework tests as a whole
    if _fast_lane() and collection_path.suffix == ".py" and collection_path.parent == TESTS:
        return True if framework_markers(collection_path.name) else None
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        marks = framework_markers(item.nodeid) | {m for m in FRAMEWORK_MARKERS if item.get_closest_marker(m)}
        for mark in sorted(marks):
            item.add_marker(mark)
        if marks:
            item.add_marker("framework")
    _longest_modules_first(items)
    if _fast_lane():
        # the fast lane: no framework, and nothing that takes more than a few seconds
        dropped = [item for item in items if item.get_closest_marker("framework") or item.get_closest_marker("slow")]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            ids = {id(item) for item in dropped}
            items[:] = [item for item in items if id(item) not in ids]


# Seconds each module took in the last measured full run (benchmarks/suite_durations.py
# --write): the workers take modules longest first, so that no long module starts last and
# leaves one worker running alone (scripts/test passes --no-loadscope-reorder, which keeps this
# order; xdist's own reorder sorts by the number of tests). A module not in the table counts as
# the table's median.
DURATIONS = TESTS / "durations.json"


def _longest_modules_first(items) -> None:
    try:
        seconds: dict[str, float] = json.loads(DURATIONS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not seconds:
        return
    default = sorted(seconds.values())[len(seconds) // 2]
    order = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        order.setdefault(module, (-seconds.get(module, default), len(order)))
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])


def pytest_runtest_logreport(report):
    """With PORTER_TEST_DURATIONS=FILE, every test phase's seconds are appended to FILE as it
    ends (in the controller, not in the xdist workers), in ``--durations``' line format: an
    interrupted run still says where its time went (benchmarks/suite_durations.py FILE)."""
    path = os.environ.get("PORTER_TEST_DURATIONS")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{report.duration:.2f}s {report.when} {report.nodeid}\n")


@pytest.fixture(autouse=True)
def _framework_tripwire(request, tmp_path_factory):
    """In the fast lane: fail a test during which a framework import was attempted anywhere,
    even when the test itself caught the error (the log is written by the refused import)."""
    if not _fast_lane():
        yield
        return
    log = tmp_path_factory.getbasetemp() / f"tripwire-{os.getpid()}-{abs(hash(request.node.nodeid))}.log"
    log.unlink(missing_ok=True)
    before = os.environ.get(tripwire.LOG_ENV)
    os.environ[tripwire.LOG_ENV] = str(log)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(tripwire.LOG_ENV, None)
        else:
            os.environ[tripwire.LOG_ENV] = before
    if log.is_file() and log.read_text().strip():
        pytest.fail(f"a framework was imported in the fast lane: add {request.node.nodeid} to FRAMEWORK_TESTS "
                    f"in tests/conftest.py ({log.read_text().strip().splitlines()[0]})", pytrace=False)


@pytest.fixture(scope="session")
def mxnet_python() -> str:
    return mxnethelp.mxnet_python()


@pytest.fixture(scope="session")
def script_steps_mxnet(tmp_path_factory) -> tuple[Path, dict]:
    """script_steps.py's original runs in MXNet, once per test run: (the folder holding
    init_<loss>.params and the final parameters, (optimizer, loss) -> (losses, final file)).
    Under pytest-xdist the workers share one set of runs: the first to get here makes them, in
    the run's common temporary folder, under a file lock; the others read its record."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # .../pytest-N, above each worker's popen-gwK
    folder = shared / "script_steps_mxnet"
    record = folder / "runs.json"
    with open(shared / "script_steps_mxnet.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.is_file():
            folder.mkdir(exist_ok=True)
            runs = mxnethelp.run_script_steps(folder)
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps([[opt, loss, losses, out.name] for (opt, loss), (losses, out) in runs.items()]))
            tmp.replace(record)
    runs = {(opt, loss): (losses, folder / name) for opt, loss, losses, name in json.loads(record.read_text())}
    return folder, runs
