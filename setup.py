"""Package discovery for deploycc's layout; every other setting is in pyproject.toml.

targets/, models/, runtime/ and configs/ install as deploycc.targets, deploycc.models, deploycc.runtime
and deploycc.configs (the package-dir mapping in pyproject.toml). `[tool.setuptools.packages.find]`
cannot express that: it names each package after its folder, so targets/ would be found as a top-level
`targets` and runtime/devices as `runtime.devices`. Here each mapped folder is searched with
find_packages and its subpackages are named under their deploycc parent, so a new subpackage anywhere
is in the wheel without a list to keep (tests/test_wheel.py builds one and checks).
"""
from setuptools import find_packages, setup

MAPPED = {"deploycc.targets": "targets", "deploycc.models": "models", "deploycc.runtime": "runtime",
          "deploycc.configs": "configs"}


def packages() -> list[str]:
    found = find_packages(include=["deploycc", "deploycc.*"])
    for name, folder in MAPPED.items():
        found += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]
    return found


setup(packages=packages())
