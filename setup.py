"""The slice engine's compiled kernels, built by `pip install`: the int8 matrix product
(node/inference/weights/_qgemm.c, its x86 kernels in _qgemm_x86.c) and the attention
(node/inference/arch/_attend.c: a decode step, and _attend_rows.c: several rows of one session).

Everything else is in pyproject.toml. Both are optional: without a C compiler (or with one that
rejects a flag) the install goes on and the slice engine uses torch's fbgemm kernel (f32 on ARM)
(`node.inference.weights.qgemm.available()` says which) and torch's attention. OpenMP is asked
for first: it shares the runtime torch already loaded (see _qgemm.c); without it a kernel runs on
one thread.
"""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Builds each extension with the first flag set the compiler accepts; none is fatal."""

    FLAG_SETS = ((["-O3", "-ffp-contract=off", "-fopenmp"], ["-O3", "-ffp-contract=off"]) if sys.platform != "win32"
                 else (["/O2", "/openmp"], ["/O2"]))

    def build_extension(self, ext):
        base_compile, base_link = list(ext.extra_compile_args), list(ext.extra_link_args)
        for flags in self.FLAG_SETS:
            ext.extra_compile_args = base_compile + flags
            ext.extra_link_args = base_link + [f for f in flags if f in ("-fopenmp",)]
            try:
                super().build_extension(ext)
                return
            except Exception as e:  # a compiler without OpenMP, or none at all
                print(f"swarmllm: building {ext.name} with {' '.join(flags)} failed ({e})", file=sys.stderr)
        fallback = "torch's fbgemm kernel" if ext.name.endswith("_qgemm") else "torch's attention"
        print(f"swarmllm: {ext.name} not built: the slice engine will use {fallback}", file=sys.stderr)

    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler at all (distutils raises before build_extension)
            print(f"swarmllm: compiled extensions not built ({e})", file=sys.stderr)


setup(
    ext_modules=[Extension("node.inference.weights._qgemm",
                           ["node/inference/weights/_qgemm.c", "node/inference/weights/_qgemm_x86.c"],
                           depends=["node/inference/weights/_qgemm.h"]),
                 Extension("node.inference.arch._attend",
                           ["node/inference/arch/_attend.c", "node/inference/arch/_attend_rows.c"],
                           depends=["node/inference/arch/_attend.h"])],
    cmdclass={"build_ext": OptionalBuildExt},
)
