"""Compiled line scanners of the ingest parsers (Cython). Everything else is in pyproject.toml.

Each scanner is optional: where it cannot be built (no C compiler), the install goes on and
the parsers take their Python path, which gives the same records (tests compare the two).
"""
from Cython.Build import cythonize
from setuptools import Extension, setup

SCANNERS = ["ingest/parsers/_nccl_scan.pyx", "ingest/parsers/_train_scan.pyx"]

setup(ext_modules=cythonize(
    [Extension(path[:-4].replace("/", "."), [path], optional=True) for path in SCANNERS],
    compiler_directives={"language_level": 3, "boundscheck": False, "wraparound": False},
    quiet=True,
))
