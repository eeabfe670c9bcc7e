"""Build the membw kernel: Cython, OpenMP, -O3 for this machine's vector units."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension(
                "llmgw.membw._kernel",
                ["src/llmgw/membw/_kernel.pyx"],
                extra_compile_args=["-O3", "-march=native", "-fopenmp"],
                extra_link_args=["-fopenmp"],
            )
        ],
        language_level=3,
    )
)
