from porter.platforms import PinnedVersionsRule
from porter.rules import Example


class PinnedVersions(PinnedVersionsRule):
    """
    ## What it does
    Reports a `pip install NAME==VERSION` in the file (a command string given to `os.system`
    or `subprocess`, or an argument list `[sys.executable, "-m", "pip", "install", ...]`)
    that pins `jax`, `jaxlib`, `flax` or `optax` to another version than porter's JAX
    profile (jax 0.10.2, flax 0.12.8, optax 0.2.8; docs/tpu.md). `porter check --target jax`
    reports the same in `requirements*.txt` and `constraints*.txt` files, shell scripts
    and Dockerfiles.

    ## Why
    The port is written for these versions' APIs: `nnx.Optimizer(model, tx, wrt=nnx.Param)`
    needs flax 0.11 or later, and flax, optax and jax releases are tested together.

    ## Fix safety
    Unsafe: the fix rewrites the version in the string to the profile's, which changes what
    gets installed; extras (`jax[tpu]`) and the rest of the command stay as they are.
    """

    code = "PV002"
    name = "pinned-versions-jax"
    target = "jax"
    summary = "pip install pins jax / flax / optax to other versions than porter's profile"
    examples = [
        Example(
            """
            import os

            os.system('pip install "jax[tpu]==0.4.30" flax==0.8.5 optax==0.2.8')
            """,
            """
            import os

            os.system('pip install "jax[tpu]==0.10.2" flax==0.12.8 optax==0.2.8')
            """,
            unsafe=True,
        ),
    ]
    valid = [
        "import os\nos.system('pip install jax==0.10.2 flax==0.12.8')\n",
        "import os\nos.system('pip install torch==2.1.0')\n",
    ]
