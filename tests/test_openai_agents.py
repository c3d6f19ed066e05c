"""ShelfSession with the OpenAI Agents SDK's own Runner and a model that runs offline in the test: the history the
model sees comes from memshelf, tool calls come back exactly, the user's turns can be learned from, and erasing
the user erases the conversation. On both backends, through a Shelf and through a Client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText  # noqa: E402

from memshelf import Client, InvalidInput, Owner, Shelf, StoreUnavailable  # noqa: E402
from memshelf.integrations.openai_agents import ITEM_PREFIX, ShelfSession, item_of, turn_of  # noqa: E402
from memshelf.server import create_app  # noqa: E402
from test_server import LiveServer  # noqa: E402

OWNER = Owner("home", "kaleb")
set_tracing_disabled(True)  # the SDK would send traces to OpenAI, which this machine cannot reach


class Offline(Model):
    """A model that answers how many items of conversation it was given and repeats the user's last words; asked
    about the weather, it first calls the `weather` tool."""

    def __init__(self) -> None:
        self.inputs: list[list[Any]] = []

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,
                           output_schema: Any, handoffs: Any, tracing: Any, **kwargs: Any) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.inputs.append(items)
        said = next(i["content"] for i in reversed(items) if isinstance(i, dict) and i.get("role") == "user")
        called = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items[-2:])
        if "weather" in str(said) and not called:
            call = ResponseFunctionToolCall(type="function_call", call_id="call_1", name="weather",
                                            arguments='{"city": "Porto"}', id="fc_1", status="completed")
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = f"I was given {len(items)} items; you said: {said}"
        message = ResponseOutputMessage(id="msg_1", type="message", role="assistant", status="completed",
                                        content=[ResponseOutputText(type="output_text", text=text, annotations=[])])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the tests run without streaming")


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}."


@pytest.fixture(params=["shelf", "client"])
def memory(request: pytest.FixtureRequest, target: str) -> Any:
    with Shelf.open(target, embedder=None) as shelf:
        if request.param == "shelf":
            yield shelf
            return
        secret = shelf.create_key(OWNER.tenant)[1]
        with LiveServer(create_app(target=target, embedder=None)) as live, Client(live.url, secret) as client:
            yield client


def test_the_runner_keeps_the_conversation_in_memshelf(memory: Any) -> None:
    model = Offline()
    agent = Agent(name="Assistant", instructions="Be brief.", model=model, tools=[weather])
    session = ShelfSession(memory, OWNER, thread="support")

    async def converse() -> list[str]:
        answers = []
        for said in ["I live in Porto.", "What is the weather like?", "Thanks!"]:
            answers.append((await Runner.run(agent, said, session=session)).final_output)
        return answers

    answers = asyncio.run(converse())
    assert answers[0] == "I was given 1 items; you said: I live in Porto."
    assert answers[1].startswith("I was given 5 items") and answers[2].startswith("I was given 7 items")
    tool_call = next(i for i in model.inputs[-1] if isinstance(i, dict) and i.get("type") == "function_call")
    assert (tool_call["name"], tool_call["arguments"], tool_call["call_id"]) == ("weather", '{"city": "Porto"}',
                                                                                 "call_1")
    logged = [(m.role, m.content) for m in memory.messages(OWNER, "support", limit=100)]
    assert logged[:2] == [("user", "I live in Porto."), ("assistant", "I was given 1 items; you said: I live in "
                                                                      "Porto.")]
    assert [role for role, _ in logged].count("tool") == 2 and logged[-1][0] == "assistant"
    assert all(content.startswith(ITEM_PREFIX) for role, content in logged if role == "tool")
    plan = memory.learn(OWNER, thread="support")  # the user's own words, as said
    assert [(p.op, p.key, p.value) for p in plan.proposals] == [("set_fact", "home_city", "Porto")]

    assert asyncio.run(session.get_items(limit=2)) == [item_of(*logged[-2]), item_of(*logged[-1])]
    popped = asyncio.run(session.pop_item())
    assert popped == item_of(*logged[-1]) and len(asyncio.run(session.get_items())) == len(logged) - 1
    assert asyncio.run(ShelfSession(memory, Owner("home", "maya"), thread="support").get_items()) == []
    erased = memory.forget_user(OWNER)
    assert erased.messages == len(logged) - 1 and asyncio.run(session.get_items()) == []


def test_long_and_odd_items_come_back_whole(memory: Any) -> None:
    """An item over a message's 16,000 characters (a long tool output, a long message) failed the run and left the
    items before it written; text with a NUL failed too. They are kept in parts, or as JSON, and come back as given."""
    session = ShelfSession(memory, OWNER, thread="long")
    items = [{"role": "user", "content": "Summarise: " + "lorem ipsum " * 3_000},
             {"type": "function_call_output", "call_id": "call_1", "output": "detail " * 5_000},
             {"role": "user", "content": "a\x00b"},
             {"role": "assistant", "content": "Done."}]
    asyncio.run(session.add_items(items))
    assert asyncio.run(session.get_items()) == items
    assert asyncio.run(session.get_items(limit=3)) == items[1:]
    assert asyncio.run(session.pop_item()) == items[3]
    assert asyncio.run(session.pop_item()) == items[2]
    assert asyncio.run(session.pop_item()) == items[1]  # its three messages go together
    assert asyncio.run(session.get_items()) == items[:1]
    with pytest.raises(TypeError):
        asyncio.run(session.add_items([{"role": "user", "content": "kept?"}, {"output": object()}]))
    assert asyncio.run(session.get_items()) == items[:1]  # checked before anything was written


def test_an_add_is_kept_whole_or_not_at_all(memory: Any) -> None:
    """Items are logged in one transaction (a Shelf) or in requests that are each all or nothing (a Client, which
    sends more than a request's 1 MiB in several): before, each message was written alone, so a refusal or a lost
    connection half-way kept the items before it, and an item's head could stay without its later parts."""
    session = ShelfSession(memory, OWNER, thread="big")
    items = [{"role": "user", "content": f"Part {i}: " + "lorem ipsum " * 20_000} for i in range(6)]  # 1.4 MB
    asyncio.run(session.add_items(items))
    assert asyncio.run(session.get_items()) == items
    refused = ShelfSession(memory, OWNER, thread="big", ttl=-1)  # a ttl that is no time at all
    with pytest.raises(InvalidInput):
        asyncio.run(refused.add_items([{"role": "user", "content": "kept?"}, {"role": "user", "content": "too?"}]))
    assert asyncio.run(session.get_items()) == items  # nothing of the refused add


class LosesItsSecondRequest(Client):
    """A Client whose connection drops at its second request of a batch of messages."""

    sent = 0

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        if path.endswith("/messages/batch"):
            self.sent += 1
            if self.sent == 2:
                raise StoreUnavailable("the connection was lost")
        return super()._json(method, path, **kwargs)


def test_through_a_client_a_lost_request_keeps_only_whole_items(target: str) -> None:
    """Items of more than a request's 1 MiB went in requests cut at 1,000 turns or 1 MiB, wherever that fell: a
    request lost after the first kept an item's head (and some of its parts) without the rest, which read back as a
    truncated item. Each request now holds whole items."""
    items = [{"role": "user", "content": f"Item {i}: " + "lorem ipsum " * 3_400} for i in range(30)]  # 3 parts each
    with Shelf.open(target, embedder=None) as shelf:
        secret = shelf.create_key(OWNER.tenant)[1]
        with LiveServer(create_app(target=target, embedder=None)) as live, \
                LosesItsSecondRequest(live.url, secret) as client:
            session = ShelfSession(client, OWNER, thread="lossy")
            with pytest.raises(StoreUnavailable):
                asyncio.run(session.add_items(items))
            kept = asyncio.run(session.get_items())
            assert 0 < len(kept) < len(items) and kept == items[:len(kept)]  # whole items, the first ones
            assert len(shelf.messages(OWNER, "lossy", limit=1_000)) == 3 * len(kept)
            asyncio.run(session.add_items(items[len(kept):]))  # the connection is back: the rest
            assert asyncio.run(session.get_items()) == items


def test_clear_session_erases_the_thread_only(memory: Any) -> None:
    session, other = ShelfSession(memory, OWNER, thread="a"), ShelfSession(memory, OWNER, thread="b")
    asyncio.run(session.add_items([{"role": "user", "content": "Hello."}]))
    asyncio.run(other.add_items([{"role": "user", "content": "Hi."}]))
    asyncio.run(session.clear_session())
    assert asyncio.run(session.get_items()) == [] and asyncio.run(other.get_items()) == [
        {"role": "user", "content": "Hi."}]
    assert asyncio.run(session.pop_item()) is None


@pytest.mark.parametrize("item, turn", [
    ({"role": "user", "content": "I live in Porto."}, ("user", "I live in Porto.")),
    ({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi ", "annotations": []},
                                                          {"type": "output_text", "text": "there."}]},
     ("assistant", "Hi there.")),
    ({"type": "function_call_output", "call_id": "c1", "output": "Sunny."}, None),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "data:..."}]}, None),
    ({"role": "user", "content": ITEM_PREFIX + "{}"}, None),
])
def test_items_become_turns_and_back(item: dict[str, Any], turn: tuple[str, str] | None) -> None:
    role, content = turn_of(item)
    if turn is None:  # kept whole, and given back exactly
        assert role == "tool" and content.startswith(ITEM_PREFIX) and item_of(role, content) == item
    else:
        assert (role, content) == turn and item_of(role, content) == {"role": role, "content": content}
