"""The notebook runner's kernel client: a wait on a socket whose wake-up was consumed still gets its message."""
import asyncio
import time

import nbformat
import pytest
import zmq
import zmq.asyncio
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.session import Session

from autograder.notebooks import kernel_client
from autograder.notebooks.build import execute
from autograder.notebooks.kernel_client import RepollingChannel

STALL_S = 5  # long against REPOLL_S (1 s): a wait still pending after it has missed the message


async def wait_after_a_consumed_wakeup(channel_class):
    """A reply lands on the socket while the loop is busy and someone reads the socket's events; wait for it."""
    context = zmq.asyncio.Context()
    kernel_side = zmq.Context.instance().socket(zmq.DEALER)
    client_side = context.socket(zmq.DEALER)
    port = client_side.bind_to_random_port("tcp://127.0.0.1")
    kernel_side.connect(f"tcp://127.0.0.1:{port}")
    session = Session(key=b"test")
    channel = channel_class(client_side, session, asyncio.get_running_loop())
    try:
        waiting = asyncio.ensure_future(channel.get_msg(timeout=None))
        await asyncio.sleep(0.2)  # the wait's poll is registered on the socket's file descriptor
        session.send(kernel_side, "execute_reply", {"status": "ok"})
        time.sleep(0.5)  # the reply arrives while the event loop is not looking
        zmq.Socket.shadow(client_side.underlying).get(zmq.EVENTS)  # processing its commands consumes the edge
        return (await asyncio.wait_for(waiting, STALL_S))["msg_type"]
    except TimeoutError:
        return "still waiting"
    finally:
        kernel_side.close(linger=0)
        client_side.close(linger=0)


@pytest.mark.parametrize("channel_class, expected", [(AsyncZMQSocketChannel, "still waiting"),
                                                     (RepollingChannel, "execute_reply")])
def test_a_consumed_wakeup_stalls_a_plain_wait_but_not_a_repolling_one(channel_class, expected):
    # the plain channel's stall proves the setup really hides the message from a registered poll
    assert asyncio.run(wait_after_a_consumed_wakeup(channel_class)) == expected


def test_execute_waits_through_repolling_channels(tmp_path, monkeypatch):
    polls = []
    plain_get_msg = RepollingChannel.get_msg

    async def counted(self, timeout=None):
        polls.append(timeout)
        return await plain_get_msg(self, timeout)

    monkeypatch.setattr(kernel_client.RepollingChannel, "get_msg", counted)
    path = tmp_path / "one_cell.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")]), path)
    executed = execute(path, timeout=120)
    assert executed.cells[0].outputs[0]["text"] == "42\n"
    assert polls, "build.execute's kernel client does not wait through RepollingChannel"
