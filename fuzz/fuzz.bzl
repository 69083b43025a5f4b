"""libFuzzer harnesses: built only under --config=fuzz (clang, in its own
output base; see deploy/fuzz.sh), skipped as incompatible elsewhere and
tagged manual, so `bazel build //...` with GCC never looks at them."""

load("//bazel:dynapipe.bzl", "dynapipe_cc_binary")

FUZZ_ONLY = select({
    "//fuzz:fuzzing": [],
    "//conditions:default": ["//bazel:incompatible"],
})

def dynapipe_fuzz_target(name, srcs, deps = []):
    """A harness defining LLVMFuzzerTestOneInput; libFuzzer supplies main()."""
    dynapipe_cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + ["//fuzz:quiet"],
        # Only the harnesses link the fuzzer runtime: other programs built
        # under --config=fuzz (make_seeds) keep their own main().
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        target_compatible_with = FUZZ_ONLY,
    )
