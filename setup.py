"""Package discovery for the wheel and the sdist (the rest of the metadata is in pyproject.toml).

``codemods/`` and ``templates/`` live at the top of the repository but install inside the
``porter`` package (``porter.codemods``, ``porter.templates``; see ``[tool.setuptools.package-dir]``),
so no generic top-level import names are added. pyproject.toml's ``packages.find`` cannot put a
prefix on what it finds in a mapped folder, hence this file: every package below ``porter/``,
``codemods/`` and ``templates/`` is found, none is listed by hand.
"""
from setuptools import find_namespace_packages, setup

# folder at the top of the repository -> the package name it installs as
MAPPED = {"codemods": "porter.codemods", "templates": "porter.templates"}


def _packages() -> list[str]:
    # namespace discovery: a folder of modules is a package even before it has an __init__.py
    found = find_namespace_packages(include=["porter", "porter.*"], exclude=["*__pycache__*"])
    for folder, name in MAPPED.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_namespace_packages(folder, exclude=["*__pycache__*"])]
    return found


setup(packages=_packages())
