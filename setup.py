"""Builds the C++ core (torch_neuronx._C) against the installed torch."""

import glob
import os

from setuptools import setup

# Importing torch would autoload an installed (possibly older, or broken)
# torch_neuronx; the build needs torch alone.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

try:
    import torch
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
            # USE_KINETO: the PrivateUse1 activity profiler (csrc/runtime/profiler.cpp) includes Kineto's
            # headers, which torch ships; FMT_HEADER_ONLY: they format with fmt, which torch does not export.
            extra_compile_args=["-O2", "-fvisibility=hidden", "-DUSE_KINETO", "-DFMT_HEADER_ONLY"],
            include_dirs=[os.path.join(os.path.dirname(torch.__file__), "include", "kineto")],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
