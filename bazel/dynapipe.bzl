"""Build macros for the DynaPipe runtime: our C++ targets get the warning
flags (-Werror applies to our code only), tests link the shared Catch2 main."""

DYNAPIPE_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-sign-compare",
    # GCC 12 reports false positives from inlined libstdc++ string code at -O2
    # (GCC bugs 105329, 105651); they are not about our code.
    "-Wno-restrict",
    "-Wno-stringop-overflow",
    "-Wno-array-bounds",
]

def dynapipe_cc_library(name, copts = [], **kwargs):
    """A C++ library of ours."""
    native.cc_library(
        name = name,
        copts = DYNAPIPE_COPTS + copts,
        **kwargs
    )

def dynapipe_cc_binary(name, copts = [], **kwargs):
    """A C++ program of ours."""
    native.cc_binary(
        name = name,
        copts = DYNAPIPE_COPTS + copts,
        **kwargs
    )

def dynapipe_cc_test(name, copts = [], deps = [], size = "small", **kwargs):
    """A Catch2 test; its cases are counted by deploy/test.sh."""
    native.cc_test(
        name = name,
        copts = DYNAPIPE_COPTS + copts,
        deps = deps + ["//src/testing:catch_main"],
        size = size,
        # Static: the test main's sanitizer hooks must sit in the executable.
        linkstatic = True,
        **kwargs
    )

def dynapipe_cc_benchmark(name, copts = [], deps = [], **kwargs):
    """A Google Benchmark program (built by //..., run by hand or by scripts)."""
    native.cc_binary(
        name = name,
        copts = DYNAPIPE_COPTS + copts,
        deps = deps + ["//bazel:benchmark"],
        testonly = True,
        **kwargs
    )
