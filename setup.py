# The cffi extension is declared here because setuptools reads `cffi_modules` only from
# setup(); everything else lives in pyproject.toml.
import os
from concurrent.futures import ThreadPoolExecutor

from setuptools import setup
from setuptools.command.build_ext import build_ext


class ParallelBuildExt(build_ext):
    """Compiles an extension's C files in parallel, one compiler process per CPU this process
    may use: the kernels are one extension of some 30 files, which setuptools would compile
    one after another (its own `parallel` option only runs whole extensions side by side)."""

    def build_extensions(self) -> None:
        compiler = self.compiler

        def compile_all(
            sources,
            output_dir=None,
            macros=None,
            include_dirs=None,
            debug=0,
            extra_preargs=None,
            extra_postargs=None,
            depends=None,
        ):
            # what CCompiler.compile does, with its loop over the files run by a pool
            macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs
            )
            cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
            jobs = [(obj, *build[obj]) for obj in objects if obj in build]
            with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
                for _ in pool.map(lambda job: compiler._compile(*job, cc_args, extra_postargs, pp_opts), jobs):
                    pass  # re-raises the first CompileError
            return objects

        compiler.compile = compile_all
        super().build_extensions()


setup(cffi_modules=["native/build_ffi.py:ffibuilder"], cmdclass={"build_ext": ParallelBuildExt})
