"""Per-function cold start: handler import time and the size of the Lambda layer.

Import time: ``python -X importtime -c "import app"`` in each ``functions/<name>/`` with the layer
(``layers/core``) on the path, in a fresh interpreter each time, 5 times per function; the
number is the cumulative import time of ``app`` (this machine's Python, not Lambda's
python3.12/arm64: use it to compare functions and catch regressions). Layer size: the
layer's requirements installed for python3.12 / manylinux aarch64 (what ``sam build`` packs)
plus the ``nodemedic`` package, unzipped and zipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.results import ROOT, record, summarize

COMMAND = "make bench (python -m bench.coldstart)"
RUNS = 5


def import_ms(function_dir: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "layers" / "core"),
           "POWERTOOLS_METRICS_NAMESPACE": "NodeMedic"}
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import app"], cwd=function_dir, env=env,
                         capture_output=True, text=True, check=True)
    line = next(x for x in reversed(out.stderr.splitlines()) if x.rstrip().endswith("| app"))
    return int(line.split("|")[1]) / 1000


def layer_size() -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "python"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
                        "--platform", "manylinux2014_aarch64", "--python-version", "3.12", "--only-binary=:all:",
                        "-r", str(ROOT / "layers" / "core" / "requirements.txt")], check=True)
        shutil.copytree(ROOT / "layers" / "core" / "nodemedic", target / "nodemedic",
                        ignore=shutil.ignore_patterns("__pycache__"))
        unzipped = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
        archive = shutil.make_archive(str(Path(tmp) / "layer"), "zip", tmp, "python")
        return unzipped / 2**20, Path(archive).stat().st_size / 2**20


def main() -> None:
    results = []
    for fn in sorted(p for p in (ROOT / "functions").iterdir() if (p / "app.py").exists()):
        times = [import_ms(fn) for _ in range(RUNS)]
        results.append(summarize(f"cold start: import of functions/{fn.name}", "ms", times, COMMAND,
                                 python=sys.version.split()[0]))
    unzipped, zipped = layer_size()
    results.append(summarize("Lambda layer size (python3.12 arm64), unzipped", "MB", [round(unzipped, 2)], COMMAND,
                             zipped_mb=round(zipped, 2), limit="250 MB unzipped for function + layers"))
    record(results)


if __name__ == "__main__":
    main()
