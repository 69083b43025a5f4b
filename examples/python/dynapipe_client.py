#!/usr/bin/python3
"""DynaPipe from Python: submit a job, watch it, cancel it.

A client of the planner's gRPC API (docs/api.md) that needs only Debian's
python3-grpcio and python3-protobuf, and the system protoc
(protobuf-compiler):

- The message classes are generated from proto/*.proto with
  `protoc --python_out` on first use, into a cache directory (--gen-dir,
  default ~/.cache/dynapipe/python/<hash of the .proto files>); later runs
  reuse them. Nothing is fetched from the network.
- Calls go through grpcio's generic channel API (channel.unary_unary and
  channel.unary_stream with each message's SerializeToString / FromString),
  so neither grpc_tools nor generated service stubs are needed.
- Every call carries the metadata "authorization: Bearer <token>" (the first
  line of the planner's token file) and a deadline.

    examples/python/dynapipe_client.py submit configs/jobs/quickstart.pbtxt   # prints the job id
    examples/python/dynapipe_client.py status JOB
    examples/python/dynapipe_client.py watch JOB     # one line per change until the job ends; 0 if it succeeded
    examples/python/dynapipe_client.py cancel JOB
    examples/python/dynapipe_client.py demo JOB.pbtxt --cancel-when running
        # submit, watch, cancel once the job is running, watch it end

The planner comes from --planner or $DYNAPIPE_PLANNER (default
127.0.0.1:50051), the token from --token-file or $DYNAPIPE_TOKEN_FILE, as for
the `dynapipe` CLI. Exit status: 0 done, 1 a call failed, 2 bad usage or input.
Errors are one line on stderr.
"""

import argparse
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import types

try:
    import grpc
    from google.protobuf import json_format, text_format
except ImportError as e:
    print(f"dynapipe_client.py: {e} (needs Debian's python3-grpcio and python3-protobuf: "
          "apt-get install python3-grpcio python3-protobuf, and run with /usr/bin/python3)", file=sys.stderr)
    sys.exit(2)

DEFAULT_PLANNER = "127.0.0.1:50051"
# The planner sends plans and job listings up to 256 MiB (src/rpc/auth.h).
MAX_RESPONSE_BYTES = 256 << 20


class Failure(Exception):
    """A one-line error and the exit status it ends the program with."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


# ---- message classes, generated from proto/*.proto ----

def load_messages(proto_root, gen_dir):
    """The message classes of proto/job.proto and proto/services.proto as one
    namespace (pb.JobSpec, pb.SubmitJobRequest, ...), generating the modules
    if needed."""
    proto_dir = os.path.join(proto_root, "proto")
    try:
        names = sorted(n for n in os.listdir(proto_dir) if n.endswith(".proto"))
    except OSError as e:
        raise Failure(f"--proto-root: {proto_dir}: {e.strerror} (give the repository root)", 2)
    if "services.proto" not in names:
        raise Failure(f"--proto-root: {proto_dir} has no services.proto (give the repository root)", 2)
    digest = hashlib.sha256()
    for name in names:
        with open(os.path.join(proto_dir, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read() + b"\0")
    out = os.path.join(gen_dir, digest.hexdigest()[:16])
    if not os.path.exists(os.path.join(out, "proto", "services_pb2.py")):
        generate(proto_root, names, gen_dir, out)
    # A regular package "proto" first on the path: it wins over any other
    # module of that name (the generated code imports "from proto import ...").
    sys.path.insert(0, out)
    pb = types.SimpleNamespace()
    for module in ("proto.job_pb2", "proto.services_pb2"):
        for name, value in vars(importlib.import_module(module)).items():
            if not name.startswith("_"):
                setattr(pb, name, value)
    return pb


def generate(proto_root, names, gen_dir, out):
    protoc = shutil.which("protoc") or "/usr/bin/protoc"
    if not os.access(protoc, os.X_OK):
        raise Failure("protoc not found (Debian: apt-get install protobuf-compiler)", 2)
    try:
        os.makedirs(gen_dir, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=gen_dir, prefix=".gen-")
    except OSError as e:
        raise Failure(f"--gen-dir: {gen_dir}: {e.strerror}", 2)
    try:
        # The .proto files import each other as "proto/<name>": the include
        # root is the repository root.
        try:
            run = subprocess.run([protoc, "-I.", "--python_out=" + tmp] + ["proto/" + n for n in names],
                                 cwd=proto_root, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise Failure("protoc --python_out did not finish within 60 s", 2)
        if run.returncode != 0:
            first = (run.stderr.strip().splitlines() or ["exit status %d" % run.returncode])[0]
            raise Failure(f"protoc --python_out failed: {first}", 2)
        open(os.path.join(tmp, "proto", "__init__.py"), "w").close()
        try:
            os.rename(tmp, out)  # atomic: a concurrent run sees all modules or none
        except OSError:
            if not os.path.exists(out):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_spec(pb, path):
    """A JobSpec from a .pbtxt / .textproto / .txtpb (text format) or .json file."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise Failure(f"{path}: {e.strerror}", 2)
    spec = pb.JobSpec()
    try:
        if path.endswith(".json"):
            json_format.Parse(text, spec)
        elif path.endswith((".pbtxt", ".textproto", ".txtpb")):
            text_format.Parse(text, spec)
        else:
            raise Failure(f"{path}: unknown extension (expected .pbtxt, .textproto, .txtpb or .json)", 2)
    except (text_format.ParseError, json_format.ParseError) as e:
        raise Failure(f"{path}: {e}", 2)
    return spec


# ---- the planner's services ----

class Planner:
    """JobService calls on one channel, each with the token and a deadline."""

    def __init__(self, pb, channel, token, timeout_s):
        self._pb = pb
        self._channel = channel
        self._metadata = [("authorization", "Bearer " + token)] if token else []
        self._timeout_s = timeout_s

    def _unary(self, method, request, response_class):
        call = self._channel.unary_unary(
            "/dynapipe.proto.JobService/" + method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_class.FromString)
        return call(request, timeout=self._timeout_s, metadata=self._metadata)

    def submit(self, spec):
        """The new job's id. The planner checks the whole spec (INVALID_ARGUMENT names the field)."""
        return self._unary("Submit", self._pb.SubmitJobRequest(spec=spec), self._pb.SubmitJobResponse).job_id

    def get(self, job_id):
        return self._unary("Get", self._pb.GetJobRequest(job_id=job_id), self._pb.JobStatus)

    def cancel(self, job_id):
        """FAILED_PRECONDITION if the job already ended."""
        self._unary("Cancel", self._pb.CancelJobRequest(job_id=job_id), self._pb.CancelJobResponse)

    def watch(self, job_id, timeout_s):
        """JobEvents: now, on every change and at least every second, until the
        job ends (the stream then closes) or `timeout_s` passes."""
        call = self._channel.unary_stream(
            "/dynapipe.proto.JobService/Watch",
            request_serializer=self._pb.WatchJobRequest.SerializeToString,
            response_deserializer=self._pb.JobEvent.FromString)
        return call(self._pb.WatchJobRequest(job_id=job_id), timeout=timeout_s, metadata=self._metadata)


def state_name(pb, status):
    return pb.JobState.Value.Name(status.state)


def event_line(pb, event):
    s = event.status
    line = (f"{s.job_id} {state_name(pb, s)} iteration {s.iterations_done}/{s.spec.iterations}, "
            f"plans ready to {s.plans_ready}")
    if event.HasField("last_report"):
        r = event.last_report
        line += f", loss {r.loss:.4f}, {r.iteration_ms:.1f} ms"
    if s.error:
        line += f" ({s.error})"
    return line


def watch(pb, planner, job_id, timeout_s, on_event=None):
    """Prints a line per change of the job until it ends; returns its final state."""
    last = None
    state = None
    try:
        for event in planner.watch(job_id, timeout_s):
            state = state_name(pb, event.status)
            key = (state, event.status.iterations_done)
            if key != last:  # the planner repeats the status every second
                print(event_line(pb, event), flush=True)
                last = key
            if on_event is not None:
                on_event(event)
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED or state is None:
            raise
        raise Failure(f"{job_id} still {state} after --watch-timeout-s {timeout_s:g}")
    return state


def demo(pb, planner, spec_path, cancel_when, watch_timeout_s):
    """Submit, watch, cancel once the job is `cancel_when`, watch it end."""
    job_id = planner.submit(load_spec(pb, spec_path))
    print(f"submitted {job_id}", flush=True)
    cancelled = False

    def maybe_cancel(event):
        nonlocal cancelled
        if not cancelled and state_name(pb, event.status) == cancel_when:
            planner.cancel(job_id)
            cancelled = True
            print(f"cancelled {job_id}", flush=True)

    final = watch(pb, planner, job_id, watch_timeout_s, maybe_cancel)
    print(f"{job_id} ended {final}", flush=True)
    if not cancelled:
        raise Failure(f"{job_id} ended {final} before it was {cancel_when}")
    return 0 if final == "cancelled" else 1


# ---- command line ----

def connect(address, address_from, tls_ca, connect_timeout_s):
    options = [("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)]
    if tls_ca:
        try:
            with open(tls_ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        except OSError as e:
            raise Failure(f"--tls-ca: {tls_ca}: {e.strerror}", 2)
        channel = grpc.secure_channel(address, creds, options)
    else:
        channel = grpc.insecure_channel(address, options)
    try:
        grpc.channel_ready_future(channel).result(timeout=connect_timeout_s)
    except grpc.FutureTimeoutError:
        channel.close()
        raise Failure(f"planner {address} ({address_from}) unreachable within {connect_timeout_s:g} s")
    return channel


def read_token(path, path_from):
    if not path:
        return ""  # a planner without a token (loopback only) takes calls without one
    try:
        with open(path) as f:
            token = f.readline().strip()
    except OSError as e:
        raise Failure(f"{path_from}: {path}: {e.strerror}", 2)
    if not token:
        raise Failure(f"{path_from}: {path}: empty token file", 2)
    return token


def parse_args(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    p = argparse.ArgumentParser(description="Submit, watch and cancel DynaPipe jobs from Python.")
    p.add_argument("--planner", help="HOST:PORT (default $DYNAPIPE_PLANNER, else %s)" % DEFAULT_PLANNER)
    p.add_argument("--token-file", help="the planner's token file (default $DYNAPIPE_TOKEN_FILE)")
    p.add_argument("--tls-ca", help="PEM roots to verify a TLS planner")
    p.add_argument("--timeout-s", type=float, default=10, help="deadline of each call (default 10)")
    p.add_argument("--connect-timeout-s", type=float, default=2,
                   help="how long to wait for the planner to accept a connection (default 2)")
    p.add_argument("--watch-timeout-s", type=float, default=3600,
                   help="deadline of a whole watch (default 3600)")
    p.add_argument("--proto-root", default=os.path.normpath(os.path.join(here, "..", "..")),
                   help="directory holding proto/*.proto (default: this repository)")
    p.add_argument("--gen-dir", default=os.path.join(cache, "dynapipe", "python"),
                   help="where generated modules are cached (default ~/.cache/dynapipe/python)")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("submit", help="submit a job spec, print its id").add_argument("spec")
    sub.add_parser("status", help="one job's status").add_argument("job")
    sub.add_parser("watch", help="print the job's changes until it ends").add_argument("job")
    sub.add_parser("cancel", help="cancel a job").add_argument("job")
    d = sub.add_parser("demo", help="submit, watch, cancel once the job reaches a state, watch it end")
    d.add_argument("spec")
    d.add_argument("--cancel-when", default="running", choices=["pending", "running"],
                   help="the state at which to cancel (default running)")
    return p.parse_args(argv)


def run(args):
    pb = load_messages(args.proto_root, args.gen_dir)
    address = args.planner or os.environ.get("DYNAPIPE_PLANNER") or DEFAULT_PLANNER
    address_from = ("--planner" if args.planner else
                    "$DYNAPIPE_PLANNER" if os.environ.get("DYNAPIPE_PLANNER") else "the default")
    token_file = args.token_file or os.environ.get("DYNAPIPE_TOKEN_FILE", "")
    token = read_token(token_file, "--token-file" if args.token_file else "$DYNAPIPE_TOKEN_FILE")
    channel = connect(address, address_from, args.tls_ca, args.connect_timeout_s)
    try:
        planner = Planner(pb, channel, token, args.timeout_s)
        if args.command == "submit":
            print(planner.submit(load_spec(pb, args.spec)))
        elif args.command == "status":
            s = planner.get(args.job)
            print(json_format.MessageToJson(s, preserving_proto_field_name=True, indent=None))
        elif args.command == "cancel":
            planner.cancel(args.job)
            print(f"cancelled {args.job}")
        elif args.command == "watch":
            return 0 if watch(pb, planner, args.job, args.watch_timeout_s) == "succeeded" else 1
        elif args.command == "demo":
            return demo(pb, planner, args.spec, args.cancel_when, args.watch_timeout_s)
        return 0
    finally:
        channel.close()


def main(argv):
    args = parse_args(argv)
    prog = "dynapipe_client.py " + args.command
    try:
        return run(args)
    except Failure as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return e.code
    except grpc.RpcError as e:  # a call failed: the planner's status code and message
        hint = f" (--timeout-s {args.timeout_s:g})" if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else ""
        print(f"{prog}: {e.code().name}: {e.details()}{hint}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
