"""Maps the repository layout onto the import package (pyproject.toml holds everything else).

`sdk/` is `duetaspan`, `tools/` is `duetaspan.tools`, `adapters/` is `duetaspan.adapters`; subpackages are
discovered so that an editable install and a built wheel import the same modules. Folders that hold only
data (the WebRTC page's `static/`) are listed as packages too, so that their files (`package-data` in
pyproject.toml) go into the wheel without setuptools' "absent from `packages`" warning.
"""

from setuptools import find_namespace_packages, setup

LAYOUT = {"duetaspan": "sdk", "duetaspan.tools": "tools", "duetaspan.adapters": "adapters"}


def _packages() -> list[str]:
    names: list[str] = []
    for name, folder in LAYOUT.items():
        names.append(name)
        subs = find_namespace_packages(folder, exclude=["*__pycache__*"])
        names.extend(f"{name}.{sub}" for sub in subs)
    return names


setup(packages=_packages(), package_dir=LAYOUT)
