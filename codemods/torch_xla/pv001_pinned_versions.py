from porter.platforms import PinnedVersionsRule
from porter.rules import Example


class PinnedVersions(PinnedVersionsRule):
    """
    ## What it does
    Reports a `pip install NAME==VERSION` in the file (a command string given to `os.system`
    or `subprocess`, or an argument list `[sys.executable, "-m", "pip", "install", ...]`)
    that pins `torch` or `torch_xla` to another version than porter's torch-xla profile
    (torch 2.9.0, torch_xla 2.9.0; docs/tpu.md). `porter check` reports the same in
    `requirements*.txt` and `constraints*.txt` files, shell scripts and Dockerfiles among the
    paths it checks.

    ## Why
    The port is written for the torch_xla 2.9 API and tested with torch 2.9.0: torch_xla
    wheels are built against one torch version (another one fails at import with an
    undefined symbol), and older torch_xla releases lack the API the port uses
    (`torch_xla.sync()`, `torch_xla.launch`).

    ## Fix safety
    Unsafe: the fix rewrites the version in the string to the profile's, which changes what
    gets installed; the rest of the command (extras, index URLs) stays as it is. A pin in an
    argument list element with escapes is reported only.
    """

    code = "PV001"
    name = "pinned-versions-torch-xla"
    target = "torch-xla"
    summary = "pip install pins torch / torch_xla to other versions than porter's profile"
    examples = [
        Example(
            """
            import os

            os.system("pip install -q torch==2.1.0 'torch_xla[tpu]==2.1.0' -f https://storage.googleapis.com/libtpu-releases/index.html")
            """,
            """
            import os

            os.system("pip install -q torch==2.9.0 'torch_xla[tpu]==2.9.0' -f https://storage.googleapis.com/libtpu-releases/index.html")
            """,
            unsafe=True,
        ),
        Example(
            """
            import subprocess, sys

            subprocess.check_call([sys.executable, "-m", "pip", "install", "torch_xla==2.5.1"])
            """,
            """
            import subprocess, sys

            subprocess.check_call([sys.executable, "-m", "pip", "install", "torch_xla==2.9.0"])
            """,
            unsafe=True,
            title="an argument list",
        ),
        Example(
            """
            STEPS = ["apt-get update", "pip install torch_xla==2.8.0"]
            """,
            """
            STEPS = ["apt-get update", "pip install torch_xla==2.9.0"]
            """,
            unsafe=True,
            title="a list of commands",
        ),
    ]
    valid = [
        "cmds = ['pip install torch==2.9.0', 'echo torch==2.1.0']\n",
        "import os\nos.system('pip install torch==2.9.0 torch_xla==2.9.0')\n",
        "import os\nos.system('pip install numpy==1.26.4 torch~=2.1')\n",
        "x = ['torch==2.1.0']\n",
    ]
