"""Build and install sglang-lookahead: the Cython trie and the SGLang plugin entry point."""

import os
import re

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

# LOOKAHEAD_SANITIZE=thread (or address,undefined) builds the trie with those
# sanitizers, for hunting races and memory errors in the native code; run it
# with the sanitizer's runtime in LD_PRELOAD (tests/unit/test_sanitizers.py does).
sanitize = os.environ.get("LOOKAHEAD_SANITIZE", "")
compile_args = ["-std=c++17", "-pthread"]
link_args = ["-pthread"]
if sanitize:
    compile_args += ["-O1", "-g", "-fno-omit-frame-pointer", f"-fsanitize={sanitize}"]
    link_args.append(f"-fsanitize={sanitize}")
else:
    # -g0 overrides the -g of Python's own CFLAGS: debug info would make up
    # four fifths of the wheel.
    compile_args += ["-O3", "-g0"]

# The native trie, one extension module per idea; they share declarations
# through .pxd files (lookahead/trie/_native.pxd, and one beside each module that
# others cimport) and call each other's cdef functions natively.
NATIVE_MODULES = ("_tokens", "_store", "_inserter", "_draft_tree", "_matching", "_drafting")

extensions = [
    Extension(
        f"lookahead.trie.{name}",
        [f"lookahead/trie/{name}.pyx"],
        include_dirs=[np.get_include(), "lookahead/trie"],
        depends=["lookahead/trie/_native.hpp", "lookahead/trie/_native.pxd"],
        language="c++",
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for name in NATIVE_MODULES
]

# The one SGLang release the plugin supports (checked at run time by
# lookahead.check_sglang_version, pinned here for pip).
SGLANG_VERSION = re.search(r'^SUPPORTED_SGLANG_VERSION = "([^"]+)"', open("lookahead/__init__.py").read(), re.M)[1]

setup(
    name="sglang-lookahead",
    version="0.1.0",
    description="Trie-based lookahead speculative decoding for SGLang, as a plugin",
    long_description=open("README.md").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    author="sglang-lookahead developers",
    license_expression="Apache-2.0",  # SPDX (PEP 639; setuptools >= 77)
    license_files=["LICENSE"],
    keywords=["sglang", "speculative decoding", "lookahead decoding", "trie", "n-gram", "llm", "inference"],
    # No "License ::" classifier: setuptools refuses one next to a license
    # expression.
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Cython",
        "Programming Language :: C++",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    # sglang 0.5.23 itself requires Python >= 3.11.
    python_requires=">=3.11",
    packages=find_packages(include=["lookahead", "lookahead.*"]),
    # The wheel holds what a user runs, no more: the package's Python and the
    # built trie. The CPU stand-ins (cpu/: a pure-torch sgl_kernel that would
    # shadow the real one if installed), the models and GPU-machine
    # scaffolding (tools/), benchmarks and tests stay in the checkout;
    # tests/unit/test_wheel.py checks the wheel's file list.
    include_package_data=False,
    ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}),
    install_requires=[f"sglang=={SGLANG_VERSION}", "numpy", "torch"],
    extras_require={
        "test": ["pytest", "hypothesis", "matplotlib"],
        "gpu": ["flashinfer-python"],
        # --speculative-lookahead-share: the fleet's history through Redis Streams.
        "share": ["redis"],
    },
    entry_points={
        "sglang.srt.plugins": ["lookahead = lookahead.plugin:register"],
        "console_scripts": [
            "lookahead-replay = lookahead.replay:main",
            "lookahead-validate = lookahead.validate.__main__:main",
        ],
    },
)
