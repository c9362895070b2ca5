"""A cloud answer larger than the gateway's channel reads: said as such, not "too many requests".

gRPC refuses a message past a channel's limit with RESOURCE_EXHAUSTED ("Received message larger
than max"), and the gateway mapped that code to 429, so a browser or script was told to slow
down and try again, which only gave the same answer again. The cloud itself never aborts with
RESOURCE_EXHAUSTED (a spent budget is FAILED_PRECONDITION, 409; the planner's "provider rate
limited" is on Decide, which the gateway never calls), so in the gateway the code only means a
message too large. Proves it with a real gRPC server on loopback answering 5 MB to a channel
that reads 4 MiB (the console's default) and the gateway's own `describe`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from console.gateway.errors import describe

ANSWER_BYTES = 5 * 1024 * 1024
METHOD = "/amc.test.Oversize/Answer"


def _answer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b"x" * ANSWER_BYTES


@pytest.fixture
async def oversize_server() -> AsyncIterator[str]:
    """The address of a server whose one method answers more than a default channel reads."""
    server = grpc.aio.server(options=[("grpc.max_send_message_length", 2 * ANSWER_BYTES)])
    handler = grpc.method_handlers_generic_handler(
        "amc.test.Oversize",
        {"Answer": grpc.unary_unary_rpc_method_handler(_answer)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_an_answer_too_large_is_a_bad_gateway_that_says_so(oversize_server: str) -> None:
    async with grpc.aio.insecure_channel(oversize_server) as channel:
        call = channel.unary_unary(METHOD)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(b"")
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    status, message, name = describe(refused.value)
    assert status == 502  # not 429: waiting gets the same answer
    assert name == "RESOURCE_EXHAUSTED"
    assert message.startswith("the cloud's answer was too large for this console"), message
    assert "Received message larger than max" in message  # gRPC's own numbers are kept
