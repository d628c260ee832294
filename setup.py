"""One installed package, `toolkit`, whose subpackages keep the design card's top-level folders.

The repository reads as the architecture (`runtime/`, `bench/`, `diagnose/`, `reports/`, `traces/`), while the
wheel installs a single name: `runtime/` becomes `toolkit.runtime`, and so on. setuptools' `package_dir` maps
each folder; the package list is computed so that a new subpackage can never be left out of the wheel.
Nothing outside these folders (benchmarks/, tests/, toolkit-out/, results) is packaged.
"""
from setuptools import find_packages, setup

ROOTS = ("runtime", "bench", "diagnose", "reports", "traces", "tune")


def packages() -> list[str]:
    names = ["toolkit"]
    for root in ROOTS:
        names.append(f"toolkit.{root}")
        names.extend(f"toolkit.{root}.{sub}" for sub in find_packages(root))
    return names


setup(
    packages=packages(),
    package_dir={"toolkit": "toolkit", **{f"toolkit.{root}": root for root in ROOTS}},
)
