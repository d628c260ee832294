"""One installed package: the wheel holds `toolkit` and nothing generated, and an installed copy works from any
directory (data files read through importlib.resources, not the checkout)."""
from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(REPO)], check=True, timeout=300, capture_output=True)
    (path,) = out.glob("toolkit-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; the dependencies come from this venv's site-packages (a path entry:
    its .pth files, the editable install of the checkout among them, are not run)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
                   check=True, timeout=300, capture_output=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_the_wheel_installs_one_top_level_name_and_nothing_generated(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith((".dist-info", ".data"))}
    assert top == {"toolkit"}
    subpackages = {n.split("/")[1] for n in names if n.startswith("toolkit/") and n.count("/") >= 2}
    assert {"runtime", "bench", "diagnose", "reports", "traces", "tune"} <= subpackages
    for unwanted in ("toolkit-out", "benchmarks", "tests", "results", "__pycache__", ".whl"):
        assert not [n for n in names if f"/{unwanted}/" in f"/{n}"], unwanted
    for data in ("toolkit/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv",
                 "toolkit/runtime/model_loader/presets/llama-3.1-8b.json",
                 "toolkit/runtime/kernels/paged_decode.cpp", "toolkit/runtime/kernels/elementwise.cpp",
                 "toolkit/runtime/kernels/cpu_math.h", "toolkit/reports/templates/report.css"):
        assert data in names, data


def test_an_installed_copy_works_outside_the_checkout(installed, tmp_path):
    bin_dir = installed / "bin"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    where = run(str(bin_dir / "python"), "-c", "import toolkit, toolkit.bench.datasets.trace as t; "
                "print(toolkit.__file__); print(t.DEFAULT_TRACE.exists(), t.DEFAULT_TRACE)")
    assert where.returncode == 0, where.stderr
    package_file, trace = where.stdout.splitlines()
    assert str(installed) in package_file and str(REPO) not in package_file
    assert trace.startswith("True ") and str(installed) in trace
    engine = run(str(bin_dir / "python"), "-c", "from toolkit.runtime import Engine; print(Engine.__module__)")
    assert engine.returncode == 0 and engine.stdout.strip() == "toolkit.runtime.engine", engine.stderr
    help_text = run(str(bin_dir / "toolkit"), "bench", "--dataset", "trace", "--help")
    assert help_text.returncode == 0 and "--trace-time-scale" in help_text.stdout, help_text.stderr
    log = tmp_path / "server.log"
    log.write_text("[2026-11-23 10:00:00] Decode batch. #running-req: 4, #token: 100, token usage: 0.01, "
                   "cuda graph: False, gen throughput (token/s): 50.00, #queue-req: 0\n")
    diagnosis = run(str(bin_dir / "toolkit"), "diagnose", str(log))
    assert diagnosis.returncode == 0, diagnosis.stderr
    assert "decode" in diagnosis.stdout.lower()
