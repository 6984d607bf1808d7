from porter.gcsdata import GcsDataRule
from porter.rules import Example


class GcsDataRoot(GcsDataRule):
    """
    ## What it does
    With `porter migrate --data gs://BUCKET/PREFIX` (opt-in; off otherwise): finds the
    script's dataset root (the string default of a `--data` / `--data-dir` / `--root`...
    option, or a string assigned to `DATA_DIR` / `data_root`...), makes the loaders that read
    paths built from it read through `fsspec.open(path, "rb").open()` (`open()` becomes
    `fsspec.open()`): `np.load`, `torch.load`, `PIL.Image.open`, `pandas.read_csv`...; and
    sets the root to the bucket path. Reports, at their line, the uses that need a local
    folder (`np.memmap`, torchvision datasets with `download=True`, `ImageFolder`,
    `os.listdir`, `glob`, `pathlib.Path`) and the writers given a data path (`torch.save`,
    `np.save`, `open()` in a write mode); the root is then left local (stage the data).

    ## Why
    On a TPU VM or in Colab the data lives in Cloud Storage. fsspec with gcsfs reads `gs://`
    paths as file objects (and local paths as before); memory maps, folder listings and
    downloads need files on the local disk.

    ## Fix safety
    Unsafe: the script then reads (and may write) the bucket instead of the local folder.
    Applied with `--data` and `--unsafe-fixes`; without `--data` the root is only reported.
    """

    code = "DT002"
    name = "gcs-data-root-jax"
    target = "jax"
    summary = "--data gs://...: the dataset root read from Cloud Storage through fsspec/gcsfs"
    examples = [
        Example(
            """
            import argparse
            import numpy as np

            parser = argparse.ArgumentParser()
            parser.add_argument("--data-dir", default="./data")
            args = parser.parse_args()
            x = np.load(args.data_dir + "/x.npy")
            """,
            None,
            title="without --data: the root is reported",
        ),
    ]
    valid = [
        "import numpy as np\nx = np.load('x.npy')\n",
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', default='0.1')\n",
    ]
