"""Starting or joining Ray, for every `--engine ray` (featurize's actor pool, a grid's stacks): one place.

`ray_module()` imports Ray (an optional dependency: the `ray` extra) or says how to install it; `connect(ray,
address)` starts a local Ray, or joins the cluster at `address` ('auto': the one running on this machine,
HOST:PORT: a head node), within a bounded time, once per process; `environ(values)` sets environment variables
for a block.
"""
from __future__ import annotations

import contextlib
import os
import socket

CONNECT_TIMEOUT_S = 10.0  # a cluster's GCS port answers a TCP connect in milliseconds; 10 s allows a slow WAN
GCS_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"  # Ray's attempts (~1 s apart) at the GCS in ray.init
GCS_CONNECT_ATTEMPTS = "1"  # the port answered: a GCS that is up answers at once (an attempt waits 30+ s; default 20)


def ray_module():
    """The `ray` module, or a ValueError saying how to install it."""
    try:
        import ray  # here: Ray is an optional dependency (headstore[ray])
    except ImportError:
        raise ValueError("--engine ray needs Ray: pip install 'headstore[ray]' "
                         "(or `python3 -m pip install ray[data]==2.60.0`)") from None
    return ray


def connect(ray, address: str | None) -> None:
    """Start Ray here, or join the cluster at `address` (once per process), within a bounded time.

    Ray alone retries a dead address for about 14 minutes (RAY_NUM_REDIS_GET_RETRIES = 20 attempts of
    ~40 s: 5 s GCS connect, 5 s pubsub, 30 s py_gcs_connect_timeout_s); so the address's port is first
    asked with a TCP connect of CONNECT_TIMEOUT_S, and Ray then gets GCS_CONNECT_ATTEMPTS attempts
    (RAY_gcs_server_port_wait_time_s, read by each ray.init; a value the user set is kept). A process already
    connected (a test's cluster, a notebook's ray.init) keeps its connection."""
    if ray.is_initialized():
        return
    if address:
        probe(address)
    attempts = {} if os.environ.get(GCS_WAIT_ENV) or not address else {GCS_WAIT_ENV: GCS_CONNECT_ATTEMPTS}
    try:
        with environ(attempts):
            ray.init(address=address, log_to_driver=False, include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise ValueError(f"--address {address}: cannot start or join Ray ({err}); start a "
                         "cluster with `ray start --head`, or leave --address out") from None


def probe(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """ValueError naming `address` when nothing accepts a TCP connection at its host:port within
    `timeout` ('auto', 'local' and addresses without a port are left to Ray)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise ValueError(f"--address {address}: no Ray cluster answers there (a TCP connect within "
                         f"{timeout:g} s: {err.strerror or err}); start one with `ray start --head` and give "
                         "the address it prints, or leave --address out to start a local Ray") from None


@contextlib.contextmanager
def environ(values: dict[str, str]):
    """`values` in os.environ for the block, the previous values restored after it."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
