"""`.cu` -> objects with the toolkit's nvcc, wrapped in a cc_library.

Targets built with these macros exist only under --config=cuda (chosen by
deploy/setup.sh where /usr/local/cuda holds the toolkit); elsewhere they are
skipped as incompatible, so a CPU-only machine still builds //... cleanly."""

_NVCC = "/usr/local/cuda/bin/nvcc"

# sm_80 (A100) and sm_90 (H100/H200) machine code, plus PTX for newer devices.
_NVCC_FLAGS = " ".join([
    "-c",
    "-O3",
    "-std=c++20",
    "-Xcompiler -fPIC",
    "-Xcompiler -Wall",
    "-Werror all-warnings",
    "--expt-relaxed-constexpr",
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
])

# Every .cu file may turn CUDA errors into absl::Status (runtime/device).
_DEVICE_HDR = "//runtime/device:cuda_status.h"
_DEVICE_LIB = "//runtime/device:cuda_status"

CUDA_ONLY = select({
    "//bazel:cuda_enabled": [],
    "//conditions:default": ["//bazel:incompatible"],
})

def dynapipe_cuda_library(name, srcs, hdrs = [], deps = [], nvcc_hdrs = [], visibility = None):
    """Compiles each .cu in `srcs` with nvcc; `hdrs` are visible to them and to users.

    `nvcc_hdrs`: headers of other packages the .cu files include (exported
    files, e.g. "//src/common:keyed_normal.h"); their libraries go in `deps`."""
    objs = []
    for src in srcs:
        obj = src[:-len(".cu")] + ".cu.o"
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs + nvcc_hdrs + [_DEVICE_HDR],
            outs = [obj],
            cmd = "%s %s -I. -I$(GENDIR) $(location %s) -o $@" % (_NVCC, _NVCC_FLAGS, src),
            message = "nvcc " + src,
            target_compatible_with = CUDA_ONLY,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["//bazel:cuda_runtime", _DEVICE_LIB],
        linkstatic = True,
        target_compatible_with = CUDA_ONLY,
        visibility = visibility,
    )
