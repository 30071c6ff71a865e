"""Input over several hosts: training features from a tf.data service on 127.0.0.1, its dispatcher
and two workers each a process of its own, started by `utilities/data_service.py` as on other hosts.

Separate processes matter: a worker inside the test's process would run the dataset's graph with this
process's Python at hand, so a Python op would pass unnoticed (`tf.py_function` fails only on a
remote worker).
"""

import collections
import gc
import ipaddress
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from myxtts.config import load_config
from myxtts.data import service_listen
from myxtts.data.manifest import read_manifest
from myxtts.data.clip_features import reference_log_mel
from myxtts.data.pipeline import Epochs, check_dispatcher
from myxtts.diagnostics.graph_scan import dataset_ops, find_python_ops
from myxtts.training.trainer import train
from utilities import data_service
from utilities.data_service import local_service

RESCUE_S = 60  # a run that waits for a lost service gets a new worker then, and fails its test late instead of hanging


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """grpc://127.0.0.1:PORT of a dispatcher with two workers; all three stopped afterwards."""
    with local_service(2, tmp_path_factory.mktemp("data_service")) as address:
        try:
            yield address
        finally:
            # Iterators that outlived their test (Keras keeps its own in reference cycles) would ask the
            # stopped dispatcher for work every second for the rest of this process: free them first.
            gc.collect()


def _config(service, *overrides):
    return load_config(overrides=[f"data.service_address={service}", "data.batch_size=4", *overrides])


def test_one_epoch_through_the_service_brings_each_clip_once_with_its_features(service, demo_corpus):
    config = _config(service)
    assert config.data.cache_features is False  # the level's cache is off with a service
    epochs = Epochs(config, read_manifest(demo_corpus), training=True)
    clips = len(epochs.utterances)  # every demo clip (1.2-11.7 s) is within the default limits
    served = list(epochs.served_examples(0, clips).as_numpy_iterator())
    # Dynamic sharding: each clip once, although two workers process the epoch (sharding OFF gives two of each).
    assert collections.Counter(int(example["clip"]) for example in served) == {clip: 1 for clip in range(clips)}

    # What the workers computed is what this host computes: the clip's log-mel and tokens, and epoch 0's reference.
    local = load_config(overrides=["data.batch_size=4", "data.cache_features=false"])
    expected = list(Epochs(local, epochs.utterances, training=False, vocabulary=epochs.vocabulary).in_order().as_numpy_iterator())
    for example in served:
        clip = int(example["clip"])
        np.testing.assert_allclose(example["mel"], expected[clip]["mel"], atol=1e-5)
        np.testing.assert_array_equal(example["tokens"], expected[clip]["tokens"])
        reference, frames = reference_log_mel(epochs.references.reference_path(clip, epochs.epoch_key(0)), local.data)
        assert int(example["reference_length"]) == int(frames)
        np.testing.assert_allclose(example["reference_mel"], reference.numpy(), atol=1e-5)

    # The training stream is the one that reads from the service, and no Python op rides along.
    stream = epochs.stream()
    assert any(op.startswith("DataServiceDataset") for op in dataset_ops(stream))
    assert find_python_ops(stream) == []


def test_a_missing_dispatcher_is_a_clear_error_not_a_hang():
    # TensorFlow would retry registering the dataset for an hour; port 1 has no dispatcher.
    with pytest.raises(ValueError, match="no tf.data service dispatcher answers at data.service_address .* "
                                         "dispatcher --bind 127.0.0.1 --port 1` on 127.0.0.1"):
        check_dispatcher("grpc://127.0.0.1:1", timeout_s=5)


def _outside_address() -> str | None:
    """This machine's address on its default route (no packet is sent), or None without one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the interface
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if ipaddress.ip_address(address).is_loopback else address


def _refuses(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def _loopback_only(addresses: list[str]) -> bool:
    def loopback(text):
        address = ipaddress.ip_address(text)
        return (address.ipv4_mapped or address).is_loopback

    return bool(addresses) and all(loopback(a) for a in addresses)


def test_a_server_started_inside_listening_on_listens_on_that_address_only():
    import tensorflow as tf

    service = tf.data.experimental.service
    # TensorFlow's own choice, which the issue reported: every interface (the test's control).
    everywhere = service.DispatchServer(service.DispatcherConfig(port=0))
    try:
        port = int(everywhere.target.rsplit(":", 1)[1])
        assert not _loopback_only(service_listen.listening_addresses(port))
        with pytest.raises(service_listen.BindError, match=f"listens on .* port {port}, not only on 127.0.0.1"):
            service_listen.check_listening("127.0.0.1", port)
    finally:
        everywhere._stop()

    with service_listen.listening_on("127.0.0.1"):
        loopback = service.DispatchServer(service.DispatcherConfig(port=0))
    try:
        port = int(loopback.target.rsplit(":", 1)[1])
        addresses = service_listen.listening_addresses(port)
        assert _loopback_only(addresses), addresses
        service_listen.check_listening("127.0.0.1", port)
        outside = _outside_address()
        if outside is not None:
            assert _refuses(outside, port), f"{outside}:{port} accepted a connection"
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        loopback._stop()


def test_the_service_script_listens_on_loopback_by_default(service):
    port = int(service.rsplit(":", 1)[1])  # the dispatcher's; its workers' in the watchdog's tests
    addresses = service_listen.listening_addresses(port, this_process=False)
    assert _loopback_only(addresses), f"the dispatcher listens on {addresses}"
    outside = _outside_address()
    if outside is not None:
        assert _refuses(outside, port)


def _train_config(service, corpus, *overrides):
    return _config(
        service,
        f"data.train_data={corpus}",
        "model.size=tiny",
        "data.max_duration_s=6.0",
        "data.bucket_boundaries_s=[6.0]",  # one bucket: one compiled shape
        "training.gradient_accumulation_steps=1",
        "training.precision=fp32",
        "training.enable_xla_compilation=false",
        "training.eval_interval=1000",
        "training.checkpoint_interval=1000",  # `latest` only when the run stops
        "data.val_fraction=0.0",
        "training.log_interval=1",
        "training.log_samples=false",
        "training.wer_sentences=0",
        *overrides,
    )


@pytest.mark.slow
def test_a_lost_service_is_named_and_neither_hangs_the_run_nor_deafens_it_to_sigterm(demo_corpus, tmp_path):
    """Training from the service, then its workers killed under `train()`: the first is named while
    the other serves; with both gone, SIGTERM still saves and stops the run at once; resumed with no
    worker, the run stops after data.service_timeout_s naming them. Before the watchdog, both waits
    lasted until a worker joined (here: a rescue worker after RESCUE_S, so that the test fails late
    instead of hanging)."""
    from myxtts.data.service_probe import probe
    from myxtts.training.service_watchdog import ServiceLost

    processes, lines, seen = [], [], {"last_step": time.monotonic()}
    named = threading.Event()
    rescuers = []

    def rescue_after(seconds):
        def start_worker():
            processes.append(subprocess.Popen(
                [sys.executable, str(Path(data_service.__file__)), "worker", "--port", "0",
                 "--dispatcher", address.removeprefix("grpc://")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))

        rescuers.append(threading.Timer(seconds, start_worker))
        rescuers[-1].start()

    def kill(process):
        process.kill()
        process.wait()

    def then_the_other():
        named.wait(20)  # the watchdog names the first within its poll (5 s); without it, after 20 s
        kill(processes[2])  # now nothing serves
        # Batches the workers had buffered still train for a while: SIGTERM only once the steps stop.
        while time.monotonic() - seen["last_step"] < 3:
            time.sleep(0.2)
        seen["sigterm_at"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        rescue_after(RESCUE_S)

    def echo(message):
        lines.append(message)
        if message.startswith("step "):
            seen["last_step"] = time.monotonic()
        if message.startswith("step 2/") and "first" not in seen:
            kill(processes[1])
            seen["first"] = list(probe(address).gone)
            threading.Thread(target=then_the_other, daemon=True).start()
        if message.startswith("tf.data service worker "):
            named.set()

    before = signal.signal(signal.SIGTERM, lambda *_: None)  # a SIGTERM landing as train() returns does nothing
    try:
        with local_service(2, tmp_path, processes) as address:
            config = _train_config(address, demo_corpus, "training.max_steps=200", "data.service_timeout_s=600")
            result = train(config, tmp_path / "run", echo=echo)
            for rescuer in rescuers:
                rescuer.cancel()
            assert "sigterm_at" in seen, f"the run ended before nothing served: {lines[-5:]}"
            assert time.monotonic() - seen["sigterm_at"] < 30, "SIGTERM waited for a worker"
            assert result.interrupted_by == "SIGTERM", lines[-5:]
            assert any(line.startswith("SIGTERM received: saved") for line in lines)
            assert any(line.startswith("signal received while waiting for the tf.data service") for line in lines)
            named_lines = [line for line in lines if line.startswith("tf.data service worker ")]
            assert len(named_lines) == 1 and f"worker {seen['first'][0]} does not answer" in named_lines[0]
            # What it trained on came from the workers: every step of the run, finite.
            assert len(result.history) == result.step >= 2
            assert all(math.isfinite(record["loss"]) for record in result.history)

            # Resumed with both workers gone (the dispatcher still lists them): it stops after the bound.
            rescue_after(RESCUE_S)
            started = time.monotonic()
            try:
                with pytest.raises(ServiceLost, match=r"stopped waiting for the tf.data service: worker 127\.0\.0\.1:\d+ "
                                                      r"does not answer .*; 0 of 2 workers .* holds step " + str(result.step)):
                    train(_train_config(address, demo_corpus, f"training.max_steps={result.step + 3}",
                                        "data.service_timeout_s=3"), tmp_path / "run", echo=lines.append)
            finally:
                for rescuer in rescuers:
                    rescuer.cancel()
            assert time.monotonic() - started < RESCUE_S
    finally:
        signal.signal(signal.SIGTERM, before)
