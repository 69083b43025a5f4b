"""The layers of the build, bottom first: one declaration read by BUILD files
(for visibility) and by tools/check_layers.py (the CI check) and
tools/architecture.py (the picture in docs/architecture.md).

A package belongs to the layer that lists it (a trailing "/..." takes the
package and every package below it; the longest match wins). A library or
binary may depend on its own layer and on the layers in its `uses`; tests and
testonly libraries are leaves that nothing ships, so they may reach anywhere.
Within a layer packages must not form a cycle."""

LAYERS = [
    {
        "name": "fixtures",
        "doc": "Data only, no code: example job specs and the datasets' lengths that tests and benchmarks read.",
        "packages": ["//configs", "//tests/data"],
        "uses": [],
    },
    {
        "name": "third_party",
        "doc": "Build glue and system libraries wrapped as cc_library; the protobuf schemas.",
        "packages": ["//bazel/...", "//third_party/...", "//proto"],
        "uses": ["fixtures"],
    },
    {
        "name": "common",
        "doc": "Status, logging, files, clocks, flags, JSON/proto I/O; test support.",
        "packages": ["//src/common", "//src/testing"],
        "uses": ["fixtures", "third_party"],
    },
    {
        "name": "formats",
        "doc": "What the planner and the runtime share: the job spec, the plan seal, the dataset and lengths formats, checkpoint shards, safetensors files, the store, RPC and HTTP plumbing.",
        "packages": ["//src/spec", "//src/plan", "//src/data", "//src/checkpoint", "//src/safetensors", "//src/store", "//src/rpc", "//src/http"],
        "uses": ["fixtures", "third_party", "common"],
    },
    {
        "name": "planner",
        "doc": "The pure planning library: cost models, micro-batch partitioning, schedules, simulation, instruction plans.",
        "packages": ["//planner", "//planner/cost_model", "//planner/partition", "//planner/plan", "//planner/schedule", "//planner/sim", "//planner/testing"],
        "uses": ["fixtures", "third_party", "common", "formats"],
    },
    {
        "name": "device",
        "doc": "Below every runtime piece: CUDA errors as status, buffer pools, optimizer state.",
        "packages": ["//runtime/device", "//runtime/memory", "//runtime/optim"],
        "uses": ["fixtures", "third_party", "common", "formats"],
    },
    {
        "name": "comm",
        "doc": "Communicators: Gloo, NCCL and staged NCCL behind one interface, the rendezvous store.",
        "packages": ["//runtime/comm"],
        "uses": ["fixtures", "third_party", "common", "formats", "device"],
    },
    {
        "name": "kernels",
        "doc": "Kernels per backend, one family per file: CPU (OpenBLAS, vectorised loops) and CUDA (cuBLASLt, cuDNN, .cu).",
        "packages": ["//runtime/kernels/..."],
        "uses": ["fixtures", "third_party", "common", "formats", "device"],
    },
    {
        "name": "stages",
        "doc": "Model stages over the kernels: the GPT stage on CPU and CUDA, token batches, profiling.",
        "packages": ["//runtime/model"],
        "uses": ["fixtures", "third_party", "common", "formats", "device", "kernels"],
    },
    {
        "name": "backend",
        "doc": "The backend facade: one interface that builds stages and communicators for CPU or CUDA.",
        "packages": ["//runtime/backend"],
        "uses": ["fixtures", "third_party", "common", "formats", "device", "comm", "kernels", "stages"],
    },
    {
        "name": "planner_service",
        "doc": "The planner daemon's classes: job registry, planning loop, plan server, executor registry, status.",
        "packages": ["//planner/service"],
        "uses": ["fixtures", "third_party", "common", "formats", "planner"],
    },
    {
        "name": "executor",
        "doc": "The executor daemon's classes: the worker that runs instructions, checkpointing, plan prefetch.",
        "packages": ["//runtime/executor"],
        "uses": ["fixtures", "third_party", "common", "formats", "device", "comm", "kernels", "stages", "backend"],
    },
    {
        "name": "apps",
        "doc": "Applications: the dynapipe client, local runs, benchmarks, deployment, fuzzers, system tests.",
        "packages": ["//", "//cli", "//benchmarks", "//deploy/...", "//fuzz", "//tests/...", "//examples/...", "//configs", "//tools"],
        "uses": ["fixtures", "third_party", "common", "formats", "planner", "device", "comm", "kernels", "stages", "backend", "planner_service", "executor"],
    },
]

def _spec(package):
    if package.endswith("/..."):
        return package[:-len("/...")] + ":__subpackages__"
    return package + ":__pkg__"

def layer_visibility(name):
    """Visibility for a package of layer `name`: its own layer and the layers that may use it."""
    out = []
    for layer in LAYERS:
        if layer["name"] == name or name in layer["uses"]:
            out += [_spec(p) for p in layer["packages"]]
    return out
