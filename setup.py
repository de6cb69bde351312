"""Build and install sglang-lookahead: the Cython trie and the SGLang plugin entry point."""

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

extensions = [
    Extension(
        "lookahead._trie",
        ["lookahead/_trie.pyx"],
        include_dirs=[np.get_include(), "lookahead"],
        depends=["lookahead/_native.hpp"],
        language="c++",
        extra_compile_args=["-O3", "-std=c++17", "-pthread"],
        extra_link_args=["-pthread"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
]

setup(
    name="sglang-lookahead",
    version="0.1.0",
    description="Trie-based lookahead speculative decoding for SGLang, as a plugin",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["lookahead", "lookahead.*"]),
    package_data={"lookahead": ["*.pyx", "*.hpp"], "lookahead.testing": ["cpu_sgl_kernel/**/*.py"]},
    ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}),
    install_requires=["sglang==0.5.23", "numpy", "torch"],
    extras_require={
        "test": ["pytest", "hypothesis", "matplotlib"],
        "gpu": ["flashinfer-python"],
    },
    entry_points={
        "sglang.srt.plugins": ["lookahead = lookahead.plugin:register"],
        "console_scripts": ["lookahead-replay = lookahead.replay:main"],
    },
)
