# The cffi extension is declared here because setuptools reads `cffi_modules` only from
# setup(); everything else lives in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["native/build_ffi.py:ffibuilder"])
