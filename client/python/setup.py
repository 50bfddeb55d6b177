"""The optional C extension fuseml._launch (the launch hot path without ctypes); everything
else is in pyproject.toml. optional=True: a machine without a C compiler or Python headers
still installs fuseml, and launcher.py falls back to ctypes."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("fuseml._launch", ["fuseml/_launch.c"], optional=True)])
