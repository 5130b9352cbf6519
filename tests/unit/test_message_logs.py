"""Dask's logs of recent messages keep no notebook in the coordinator (autograder/batch/message_logs.py): the
client's stream, the scheduler's stream to each worker present when the plugin is installed and to each worker
that joins later. Without them the coordinator held up to 1,000 notebooks per stream."""
import pytest

pytest.importorskip("distributed")
from distributed import Client, LocalCluster  # noqa: E402

from autograder.batch.message_logs import NoMessageLog, forget_messages  # noqa: E402

NOTEBOOK = b"{" + b"x" * 100_000 + b"}"  # what a grading's task carries


def logged(cluster, client):
    """Stream -> how many messages its log holds."""
    streams = {f"to {address}": comm for address, comm in cluster.scheduler.stream_comms.items()}
    return {name: len(comm.recent_message_log) for name, comm in {**streams, "client": client.scheduler_comm}.items()}


def test_no_stream_logs_a_message_once_the_plugin_is_installed_nor_one_opened_later():
    with LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        assert client.submit(len, NOTEBOOK, pure=False).result() == len(NOTEBOOK)
        before = logged(cluster, client)
        assert all(before.values()), f"Dask logs every stream's messages by default: {before}"
        forget_messages(client.scheduler_comm)
        client.register_plugin(NoMessageLog())
        cluster.scale(2)
        client.wait_for_workers(2, timeout=60)
        for worker in client.scheduler_info()["workers"]:
            assert client.submit(len, NOTEBOOK, workers=[worker], pure=False).result() == len(NOTEBOOK)
        after = logged(cluster, client)
        assert len(after) == 3 and not any(after.values()), f"messages logged after the plugin: {after}"
