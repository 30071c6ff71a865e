#!/usr/bin/env python3
"""Start a tf.data service dispatcher or worker, so that other machines' CPUs compute the training features.

    # machine A (10.0.0.1 on the training network): the dispatcher (it only hands out work)
    python utilities/data_service.py dispatcher --bind 10.0.0.1 --port 5050
    # machines B, C, ...: one worker each, with the corpus at the same paths as in the manifest
    python utilities/data_service.py worker --dispatcher 10.0.0.1:5050 --bind 10.0.0.2 --port 5051
    # the training host
    python train_main.py --train-data /data/ljspeech --set data.service_address=grpc://10.0.0.1:5050

The workers read, decode and resample every training clip and compute its log-mel and its voice
reference, each clip once per epoch (dynamic sharding); the training host only shuffles, batches and
trains. A worker reads the audio files by the paths the manifest gives, so every worker needs the
corpus at the same paths as the training host (a shared or copied folder). This works only because
the input pipeline has no Python ops: a remote worker runs the dataset's graph without the trainer's
Python (tests/test_pipeline.py scans the graph). Each server runs until Ctrl-C or SIGTERM.

Security: the service has no authentication, and a worker runs whatever dataset graph a client sends
it (graphs can read and write files). Each server listens only on `--bind`, 127.0.0.1 by default (one
machine); give the address of the network that joins the training hosts, and make sure nothing else
can reach these ports (a private network or a firewall). `--bind 0.0.0.0` listens on every interface.
TensorFlow itself always asks for every interface; `myxtts/data/service_listen.py` holds it to
`--bind` and the server stops if it cannot (tests/test_data_service.py checks the listening sockets).
"""

import argparse
import contextlib
import select
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

STARTUP_S = 60  # TensorFlow's import on 2 loaded cores


@contextlib.contextmanager
def local_service(workers: int, log_dir: Path, processes: list | None = None) -> Iterator[str]:
    """grpc://127.0.0.1:PORT of a dispatcher and `workers` workers on this machine, each a process
    running this script (as on other hosts), their stderr in `log_dir`; all stopped on exit.
    `processes`, when given, receives their `Popen`s, the dispatcher's first (to kill one in a test).

    Separate processes matter: a worker inside the caller's process would run the dataset's graph
    with the caller's Python at hand, so a Python op would pass unnoticed.
    """
    processes = [] if processes is None else processes

    def start(args: list[str], log: Path) -> subprocess.Popen:
        with open(log, "w") as stderr:  # the child keeps its own copy of the file
            process = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=stderr, text=True)
        processes.append(process)
        return process

    def first_line(process: subprocess.Popen, log: Path) -> str:
        """What the server printed once it runs."""
        ready, _, _ = select.select([process.stdout], [], [], STARTUP_S)
        line = process.stdout.readline() if ready else ""
        if not line:
            raise RuntimeError(f"`{' '.join(process.args[1:])}` printed nothing in {STARTUP_S} s; its log:\n{log.read_text()}")
        return line

    try:
        # Port 0: the system picks free ports, so parallel callers never collide.
        dispatcher = start(["dispatcher", "--port", "0", "--bind", "127.0.0.1"], log_dir / "dispatcher.log")
        port = first_line(dispatcher, log_dir / "dispatcher.log").split("listening on port ")[1].split(";")[0]
        started = {log_dir / f"worker{i}.log": start(["worker", "--dispatcher", f"127.0.0.1:{port}", "--port", "0",
                                                       "--bind", "127.0.0.1"], log_dir / f"worker{i}.log")
                   for i in range(1, workers + 1)}  # all at once: TensorFlow's import is most of the wait
        for log, worker in started.items():
            first_line(worker, log)
        yield f"grpc://127.0.0.1:{port}"
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    roles = p.add_subparsers(dest="role", required=True)
    bind_help = ("the address to listen on (default 127.0.0.1: this machine only); the address of the network "
                 "that joins the training hosts, never one reachable by others; 0.0.0.0 = every interface")
    dispatcher = roles.add_parser("dispatcher", help="hand out the clips of each epoch to the workers",
                                  description="Start the dispatcher; point training at it with "
                                              "data.service_address: grpc://BIND_ADDRESS:PORT.")
    dispatcher.add_argument("--port", type=int, default=5050, help="port to listen on (default 5050; 0 = any free port)")
    dispatcher.add_argument("--bind", default="127.0.0.1", help=bind_help)
    worker = roles.add_parser("worker", help="compute features for the dispatcher's training runs",
                              description="Start a worker. It reads the corpus's audio files by the manifest's "
                                          "paths: the corpus must be at the same paths on this machine.")
    worker.add_argument("--dispatcher", required=True, help="the dispatcher's HOST:PORT")
    worker.add_argument("--port", type=int, default=5051, help="port to listen on (default 5051; 0 = any free port)")
    worker.add_argument("--bind", default="127.0.0.1", help=bind_help)
    worker.add_argument("--address", default=None,
                        help="host name or IP address by which the training host reaches this worker (default: the "
                             f"--bind address; with --bind 0.0.0.0, this machine's name, {socket.gethostname()})")
    args = p.parse_args(argv)

    # After parsing: --help needs no TensorFlow start-up. Started without its C++ start-up lines, which
    # read as errors on a machine without a GPU, as a feature worker often is (startup_noise.py).
    from myxtts.startup_noise import quiet_tensorflow

    quiet_tensorflow()
    import tensorflow as tf

    from myxtts.data.service_listen import BindError, check_listening, is_wildcard, listening_on

    # The address others use to reach this server: the one it listens on, unless that is all of them.
    reachable_at = socket.gethostname() if is_wildcard(args.bind) else args.bind
    service, server = tf.data.experimental.service, None
    try:
        with listening_on(args.bind):
            if args.role == "dispatcher":
                server = service.DispatchServer(service.DispatcherConfig(port=args.port))
            else:
                dispatcher_address = args.dispatcher.removeprefix("grpc://")
                # The dispatcher gives this address to the training host, which fetches features from it:
                # TensorFlow's default, localhost, works only on a single machine.
                server = service.WorkerServer(service.WorkerConfig(
                    dispatcher_address=dispatcher_address, worker_address=f"{args.address or reachable_at}:%port%",
                    port=args.port))
        port = int(server._server.bound_port())  # the one chosen, also for --port 0 (no public getter for a worker)
        check_listening(args.bind, port)
    except (BindError, tf.errors.OpError, RuntimeError) as error:  # RuntimeError: TensorFlow's "could not start"
        if server is not None:
            server._stop()
        hint = "" if is_wildcard(args.bind) else f" (is {args.bind} an address of this machine? `hostname -I` lists them)"
        print(f"error: the {args.role} did not start on {args.bind} port {args.port}: {error}{hint}", file=sys.stderr, flush=True)
        return 2
    where = f"every interface ({args.bind})" if is_wildcard(args.bind) else f"{args.bind} only"
    if args.role == "dispatcher":
        print(f"dispatcher listening on port {port}; on {where}; start workers with: "
              f"python utilities/data_service.py worker --dispatcher {reachable_at}:{port}", flush=True)
        print(f"train with: --set data.service_address=grpc://{reachable_at}:{port}", flush=True)
    else:
        print(f"worker {args.address or reachable_at}:{port} (listening on {where}) serving the dispatcher at "
              f"{dispatcher_address}", flush=True)
    try:
        server.join()
    except KeyboardInterrupt:
        print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
