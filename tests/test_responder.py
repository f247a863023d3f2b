"""responder.Responder: no cancellation ask overlaps or follows a request's final response.

The Python backend's server side frees the request's response factory as it handles the final flag, and an
ask names that factory: tritonserver 2.51 died of signal 11 in TRITONBACKEND_ResponseFactoryIsCancelled when
a model's watcher thread asked about a request whose final response another thread was sending."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
import types
from pathlib import Path

import pytest

COMMON = Path(__file__).resolve().parents[1] / "specbuild" / "model_repo" / "python_models" / "common"
FINAL = 1


@pytest.fixture(scope="module")
def responder_module():
    """This tree's responder.py, loaded under its own name, with a stand-in for the stub's utils module (only
    the final flag is used); whatever another test installed stays as it was."""
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = types.SimpleNamespace(
        TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL
    )
    try:
        spec = importlib.util.spec_from_file_location("responder_under_test", COMMON / "responder.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        if saved is None:
            sys.modules.pop("triton_python_backend_utils", None)
        else:
            sys.modules["triton_python_backend_utils"] = saved


class ServerSide:
    """A response sender that counts asks made while its final response is on the way or after it (what
    frees the response factory on the server); the final send takes `hold_s`."""

    def __init__(self, hold_s: float = 0.05):
        self.hold_s = hold_s
        self.sending_final = threading.Event()
        self.freed = False
        self.asks = self.bad_asks = 0
        self.sent: list[int] = []

    def is_cancelled(self) -> bool:
        self.asks += 1
        if self.sending_final.is_set() or self.freed:
            self.bad_asks += 1
        return False

    def send(self, response=None, flags=0):
        if flags & FINAL:
            self.sending_final.set()
            time.sleep(self.hold_s)
            self.freed = True
        self.sent.append(flags)


@pytest.mark.parametrize("final", ["finish", "finish_one"])
def test_an_ask_from_another_thread_waits_for_the_final_send_and_then_asks_nothing(responder_module, final):
    server = ServerSide()
    responder = responder_module.Responder(object(), server)
    sender_thread = threading.Thread(target=getattr(responder, final), args=("response",))
    sender_thread.start()
    assert server.sending_final.wait(5)
    answers = [responder.cancelled(), responder.cancelled(max_age_s=1e-9)]  # a watcher's asks, mid-send
    sender_thread.join()
    answers.append(responder.cancelled())  # and after it
    assert answers == [False, False, False]
    assert server.bad_asks == 0 and server.sent == [FINAL]
    # finish asked once before its send (whether to write outputs); finish_one asks nothing
    assert server.asks == (1 if final == "finish" else 0)
    assert not responder.send("late")  # no data response after the final one, and no ask for it
    assert server.sent == [FINAL] and server.bad_asks == 0


def test_a_cancelled_answer_stands_after_the_final_response(responder_module):
    class Cancelled(ServerSide):
        def is_cancelled(self) -> bool:
            super().is_cancelled()
            return True

    server = Cancelled(hold_s=0.0)
    responder = responder_module.Responder(object(), server)
    assert not responder.send("chunk")  # asked afresh: cancelled, nothing written
    responder.finish("response")  # flags only
    assert responder.cancelled() and server.asks == 1 and server.bad_asks == 0 and server.sent == [FINAL]
