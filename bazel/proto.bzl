"""`.proto` -> C++ with the system protoc and grpc_cpp_plugin (no download)."""

_PROTOC = "/usr/bin/protoc"
_GRPC_PLUGIN = "/usr/bin/grpc_cpp_plugin"

def dynapipe_proto_library(name, src, deps = [], grpc = False, visibility = None):
    """Compiles one .proto into a cc_library `name`.

    Args:
      name: the cc_library; `name + "_srcs"` is the .proto and those it imports.
      src: the .proto file in this package.
      deps: other dynapipe_proto_library targets that `src` imports.
      grpc: also generate gRPC service stubs.
      visibility: of the cc_library.
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    native.filegroup(
        name = name + "_srcs",
        srcs = [src] + [d + "_srcs" for d in deps],
        visibility = visibility,
    )
    cmd = "%s -I. -I/usr/include --cpp_out=$(GENDIR)" % _PROTOC
    if grpc:
        cmd += " --grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=%s" % _GRPC_PLUGIN
    cmd += " $(location %s)" % src
    native.genrule(
        name = name + "_gen",
        srcs = [src, name + "_srcs"],
        outs = outs,
        cmd = cmd,
        message = "protoc " + src,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc"] + ([base + ".grpc.pb.cc"] if grpc else []),
        hdrs = [base + ".pb.h"] + ([base + ".grpc.pb.h"] if grpc else []),
        deps = deps + ["//bazel:protobuf"] + (["//bazel:grpc"] if grpc else []),
        visibility = visibility,
    )
