"""Builds the C++ core (torch_neuronx._C) against the installed torch."""

import glob
import os

from setuptools import setup

# Importing torch would autoload an installed (possibly older, or broken)
# torch_neuronx; the build needs torch alone.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as exc:  # pragma: no cover - guidance for a wrong install
    raise SystemExit(
        "torch-neuronx builds against an installed torch==2.13.0. Install it first, then build "
        "without isolation:\n  pip install torch==2.13.0 && pip install --no-build-isolation -e .\n"
        "(scripts/install.sh does both)."
    ) from exc

here = os.path.dirname(os.path.abspath(__file__))
sources = sorted(glob.glob(os.path.join("src", "torch_neuronx", "csrc", "**", "*.cpp"), recursive=True))

setup(
    ext_modules=[
        CppExtension(
            name="torch_neuronx._C",
            sources=sources,
            extra_compile_args=["-O2", "-fvisibility=hidden"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
