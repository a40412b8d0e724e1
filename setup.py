"""Build hook for the optional C accelerator; all metadata lives in pyproject.toml."""

from setuptools import Extension, setup

# optional=True: without a compiler the build logs a warning and installs the
# pure-Python package; eagle3kit.format._ints then uses its fallback path.
setup(ext_modules=[Extension("eagle3kit._fastints", ["eagle3kit/_fastints.c"], optional=True)])
