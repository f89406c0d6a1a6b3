"""Maps the repository layout onto the import package (pyproject.toml holds everything else).

`sdk/` is `duetaspan`, `tools/` is `duetaspan.tools`, `adapters/` is `duetaspan.adapters`; subpackages are
discovered so that an editable install and a built wheel import the same modules.
"""

from setuptools import find_packages, setup

LAYOUT = {"duetaspan": "sdk", "duetaspan.tools": "tools", "duetaspan.adapters": "adapters"}


def _packages() -> list[str]:
    names: list[str] = []
    for name, folder in LAYOUT.items():
        names.append(name)
        names.extend(f"{name}.{sub}" for sub in find_packages(folder))
    return names


setup(packages=_packages(), package_dir=LAYOUT)
