"""The server's request fields beyond deepseek-recipe's conversion: sampling in thinking mode,
max_completion_tokens, n > 1, logit_bias and penalties, the developer role, usage from token ids,
model-name and image errors. Same setup as test_server.py (a server process on the tiny model,
the official SDKs as clients)."""

from __future__ import annotations

import functools
import json

import anthropic
import deepinfer_core
import deepseek_recipe as dr
import httpx
import openai
import pytest
from deepinfer.server.app import tokenizer_json_path
from test_server import FORCE, MODEL, engine_idle, server  # noqa: F401

HI = [{"role": "user", "content": "hi"}]
EOS = "<｜end▁of▁sentence｜>"
NEW_CORE_FIELDS = hasattr(deepinfer_core.SamplingParams(), "presence_penalty")
needs_new_core = pytest.mark.skipif(
    not NEW_CORE_FIELDS,
    reason="deepinfer_core.SamplingParams has no logit_bias / presence_penalty / "
    "frequency_penalty yet (the engine change lands separately)",
)


def forced(text: str) -> dict[str, str]:
    return {FORCE: json.dumps(text)}


@functools.cache
def _tokenizer() -> dr.Tokenizer:
    return dr.Tokenizer.from_file(tokenizer_json_path())


def _tokens(text: str) -> list[int]:
    return _tokenizer().encode(text)


def _token_id(text: str) -> int:
    (token,) = _tokens(text)
    return token


def chat_text(r) -> str:
    m = r.choices[0].message
    return (getattr(m, "reasoning_content", None) or "") + "|" + (m.content or "")


# ---- 1. sampling fields apply in thinking mode ---------------------------------------------


def test_server_sampling_applies_in_thinking_mode(oai, claude) -> None:
    # Thinking is on (the request omits it). Greedy (temperature 0, or a tiny top_p, or top_k 1)
    # gives the same text whatever the seed; sampling at 1.0 would not.
    def chat(**kw):
        r = oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=12, **kw)
        return chat_text(r)

    assert chat(temperature=0, seed=1) == chat(temperature=0, seed=2)
    assert chat(top_p=1e-6, seed=1) == chat(top_p=1e-6, seed=2)
    assert chat(seed=1) != chat(seed=2)  # the control: sampling at 1.0 differs

    r1 = oai.responses.create(model=MODEL, input="hi", max_output_tokens=12, temperature=0)
    r2 = oai.responses.create(model=MODEL, input="hi", max_output_tokens=12, temperature=0)
    assert (
        r1.temperature == 0
        and r1.model_dump()["output"][0]["content"] == (r2.model_dump()["output"][0]["content"])
    )

    def message(**kw) -> list:
        m = claude.messages.create(model=MODEL, max_tokens=12, messages=HI, **kw)
        return [b.model_dump(exclude={"signature"}) for b in m.content]

    # This SDK has no sampling arguments any more; older clients send them.
    assert message(extra_body={"temperature": 0}) == message(extra_body={"temperature": 0})
    assert message(extra_body={"top_k": 1}) == message(extra_body={"top_k": 1})


def test_server_messages_thinking_rejects_what_anthropic_rejects(claude) -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    for kw, field in (({"temperature": 0.5}, "temperature"), ({"top_k": 5}, "top_k")):
        with pytest.raises(anthropic.BadRequestError, match=field):
            claude.messages.create(
                model=MODEL, max_tokens=2000, messages=HI, thinking=thinking, extra_body=kw
            )
    with pytest.raises(anthropic.BadRequestError, match="temperature"):  # Anthropic's [0, 1]
        claude.messages.create(
            model=MODEL, max_tokens=8, messages=HI, extra_body={"temperature": 1.5}
        )


# ---- 2. max_completion_tokens, Anthropic's required max_tokens -----------------------------


def test_server_max_completion_tokens(oai, server) -> None:  # noqa: F811
    r = oai.chat.completions.create(model=MODEL, messages=HI, max_completion_tokens=5)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    # Both given: max_completion_tokens wins (max_tokens is its deprecated alias).
    r = oai.chat.completions.create(model=MODEL, messages=HI, max_completion_tokens=3, max_tokens=9)
    assert r.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError, match="max_completion_tokens"):
        oai.chat.completions.create(model=MODEL, messages=HI, max_completion_tokens=0)


def test_server_messages_requires_max_tokens(server) -> None:  # noqa: F811
    r = httpx.post(server + "/v1/messages", json={"model": MODEL, "messages": HI})
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


# ---- 3. n > 1 ------------------------------------------------------------------------------


def test_server_chat_n_samples(oai, server) -> None:  # noqa: F811
    kw = dict(model=MODEL, messages=HI, max_tokens=6, extra_body={"thinking": {"type": "disabled"}})
    r = oai.chat.completions.create(n=3, seed=5, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 18 and r.usage.total_tokens == r.usage.prompt_tokens + 18
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) == 3
    # Sample i uses seed + i.
    assert oai.chat.completions.create(seed=6, **kw).choices[0].message.content == texts[1]

    stream = oai.chat.completions.create(
        n=2, seed=5, stream=True, stream_options={"include_usage": True}, **kw
    )
    parts = {0: "", 1: ""}
    finishes = {}
    usage = None
    for c in stream:
        for ch in c.choices:
            parts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
        if c.usage is not None:
            assert usage is None and not c.choices  # one summed usage chunk, last
            usage = c.usage
    assert [parts[0], parts[1]] == texts[:2] and finishes == {0: "length", 1: "length"}
    assert usage.completion_tokens == 12
    engine_idle(server)

    # A client leaving mid-stream aborts all n engine requests.
    body = {"model": MODEL, "messages": HI, "max_tokens": 3000, "n": 3, "stream": True}
    with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        for i, _ in enumerate(r.iter_lines()):
            if i == 6:
                break
    engine_idle(server)


def test_server_n_samples_share_the_prompt_kv(oai, server) -> None:  # noqa: F811
    """Samples 1..n-1 start once sample 0's prompt is computed and hit the prefix cache."""
    words = " ".join(f"w{i}" for i in range(700))
    before = httpx.get(server + "/debug/engine").json()["prompt_tokens_cached"]
    r = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": words}],
        max_tokens=3,
        n=3,
        extra_body={"thinking": {"type": "disabled"}},
    )
    assert len(r.choices) == 3 and r.usage.prompt_tokens > 3 * 128
    cached = httpx.get(server + "/debug/engine").json()["prompt_tokens_cached"] - before
    # Both followers restore every full block of the prompt (added at once, they did not).
    assert cached == 2 * 128 * ((r.usage.prompt_tokens - 1) // 128), cached
    engine_idle(server)


def test_server_n_rejected_where_unsupported(oai) -> None:
    for n in (0, 129, 1.5):
        with pytest.raises(openai.BadRequestError, match="'n'"):
            oai.chat.completions.create(model=MODEL, messages=HI, n=n)
    with pytest.raises(openai.BadRequestError, match="'n'"):  # the Responses API has no n
        oai.responses.create(model=MODEL, input="hi", extra_body={"n": 2})


# ---- 4. logit_bias and penalties -----------------------------------------------------------


def test_server_logit_bias_and_penalties_validated(oai) -> None:
    bad = [
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
    ]
    for kw, field in bad:
        with pytest.raises(openai.BadRequestError, match=field) as err:
            oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, **kw)
        assert err.value.body["param"] == field
    if not NEW_CORE_FIELDS:  # refused, never silently ignored
        with pytest.raises(openai.BadRequestError, match="presence_penalty"):
            oai.chat.completions.create(model=MODEL, messages=HI, presence_penalty=1)


def _greedy_tokens(oai, **kw) -> list[str]:
    """The content tokens of 8 greedy tokens, thinking off."""
    r = oai.chat.completions.create(
        model=MODEL,
        messages=HI,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        extra_body={"thinking": {"type": "disabled"}},
        **kw,
    )
    return [t.token for t in r.choices[0].logprobs.content]


@needs_new_core
def test_server_logit_bias_applies(oai) -> None:
    # +100 makes "a" the only token greedy sampling can pick.
    assert _greedy_tokens(oai, logit_bias={str(_token_id("a")): 100}) == ["a"] * 8


@needs_new_core
def test_server_penalties_apply(oai) -> None:
    # Greedy on the tiny model, "a" biased just enough to win every step; the penalties (OpenAI
    # semantics over the generated tokens) take its lead away.
    def count_a(bias: float, **kw) -> int:
        return _greedy_tokens(oai, logit_bias={str(_token_id("a")): bias}, **kw).count("a")

    assert count_a(6) == 8
    assert count_a(6, presence_penalty=2) <= 3 and count_a(6, frequency_penalty=2) <= 3
    # Presence costs 2 once, frequency 2 per repeat: only the latter overcomes +7.
    assert count_a(7, presence_penalty=2) == 8 and count_a(7, frequency_penalty=2) < 8


# ---- 5. the developer role -----------------------------------------------------------------


def test_server_developer_role_is_system(oai) -> None:
    # Greedy text depends on the prompt's tokens: the developer message renders as a system one.
    def chat(role: str) -> str:
        r = oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": role, "content": "Be brief."}, *HI],
            max_tokens=12,
            temperature=0,
        )
        return chat_text(r)

    assert chat("developer") == chat("system") != chat("user")

    def responses(role: str) -> list:
        r = oai.responses.create(
            model=MODEL,
            input=[{"role": role, "content": "Be brief."}, {"role": "user", "content": "hi"}],
            max_output_tokens=12,
            temperature=0,
        )
        return r.model_dump()["output"][0]["content"]

    assert responses("developer") == responses("system") != responses("user")


# ---- 6. usage from token ids, logprobs in thinking mode ------------------------------------


def test_server_usage_counts_token_ids(oai, claude) -> None:
    # "x😀" is 3 tokens, the emoji split over the last two: with max_tokens 2 the output ends
    # inside the character. Both tokens count, and their bytes are not dropped.
    assert len(_tokens("x😀")) == 3
    off = {"thinking": {"type": "disabled"}}
    r = oai.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=2, extra_headers=forced("x😀"), extra_body=off
    )
    assert r.usage.completion_tokens == 2 and r.choices[0].message.content == "x\ufffd"
    stream = oai.chat.completions.create(
        model=MODEL,
        messages=HI,
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=forced("x😀"),
        extra_body=off,
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "x\ufffd"
    assert chunks[-1].usage.completion_tokens == 2
    m = claude.messages.create(
        model=MODEL,
        max_tokens=2,
        messages=HI,
        thinking={"type": "disabled"},
        extra_headers=forced("x😀"),
    )
    assert m.usage.output_tokens == 2 and m.content[0].text == "x\ufffd"

    # Thinking: reasoning tokens are those up to </think>; completion counts EOS too.
    text = "Let me think.</think>The answer is 4." + EOS
    reasoning = len(_tokens("Let me think.</think>"))
    for stream_it in (False, True):
        kw = dict(model=MODEL, messages=HI, max_tokens=100, extra_headers=forced(text))
        if stream_it:
            chunks = list(
                oai.chat.completions.create(
                    stream=True, stream_options={"include_usage": True}, **kw
                )
            )
            usage = chunks[-1].usage
        else:
            usage = oai.chat.completions.create(**kw).usage
        assert usage.completion_tokens == len(_tokens(text))
        assert usage.completion_tokens_details.reasoning_tokens == reasoning
    r = oai.responses.create(
        model=MODEL, input="hi", max_output_tokens=100, extra_headers=forced(text)
    )
    assert r.usage.output_tokens == len(_tokens(text))
    assert r.usage.output_tokens_details.reasoning_tokens == reasoning
    # A length cut inside the reasoning: all of it is reasoning, never more than completion.
    r = oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)
    assert r.usage.completion_tokens == 4
    assert r.usage.completion_tokens_details.reasoning_tokens == 4


def test_server_logprobs_in_thinking_mode(oai) -> None:
    # All reasoning: the standard `content` list is there (empty), the reasoning's apart.
    r = oai.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, logprobs=True)
    lp = r.choices[0].logprobs
    assert lp.content == [] and len(lp.model_extra["reasoning_content"]) == 4
    r = oai.chat.completions.create(
        model=MODEL,
        messages=HI,
        max_tokens=100,
        logprobs=True,
        extra_headers=forced("Let me think.</think>The answer is 4." + EOS),
    )
    lp = r.choices[0].logprobs
    assert "".join(t.token for t in lp.content) == "The answer is 4."
    assert "".join(t["token"] for t in lp.model_extra["reasoning_content"]) == "Let me think."


# ---- 7. model-name and image errors --------------------------------------------------------


def test_server_unknown_model_is_404(oai, claude) -> None:
    with pytest.raises(openai.NotFoundError, match="nope") as err:
        oai.chat.completions.create(model="nope", messages=HI)
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError, match="nope"):
        oai.responses.create(model="nope", input="hi")
    with pytest.raises(anthropic.NotFoundError) as err:
        claude.messages.create(model="nope", max_tokens=8, messages=HI)
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "not_found_error"


PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwAB"
    "BAEAwS2OUAAAAABJRU5ErkJggg=="
)


def test_server_images_are_refused(oai, claude) -> None:
    with pytest.raises(openai.BadRequestError, match="text-only"):
        oai.chat.completions.create(
            model=MODEL,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": PNG}},
                    ],
                }
            ],
        )
    with pytest.raises(openai.BadRequestError, match="text-only"):
        oai.responses.create(
            model=MODEL,
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": PNG}]}],
        )
    data = PNG.split(",", 1)[1]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    with pytest.raises(anthropic.BadRequestError, match="text-only"):
        claude.messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [image]}]
        )
    tool_result = {"type": "tool_result", "tool_use_id": "t1", "content": [image]}
    with pytest.raises(anthropic.BadRequestError, match="text-only"):
        claude.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[
                {"role": "user", "content": "look"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "see", "input": {}}],
                },
                {"role": "user", "content": [tool_result]},
            ],
        )


def test_server_kv_retention_is_checked(oai) -> None:
    r = oai.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=2, extra_body={"kv_retention": "agent"}
    )
    assert r.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model=MODEL, messages=HI, max_tokens=2, extra_body={"kv_retention": "forever"}
        )
    assert e.value.body["param"] == "kv_retention"


def test_add_samples_followers_start_even_if_the_leader_is_already_done() -> None:
    """The leader's outputs can be dispatched right after it is added; its followers must be
    registered before that, and a follower the engine refuses fails alone."""
    import asyncio

    from deepinfer.server.async_engine import AsyncEngine, SampleNotStarted

    class Out:
        def __init__(self, rid: int, tokens: list[int], finish: str | None) -> None:
            self.id, self.tokens, self.finish, self.ready = rid, tokens, finish, False

    class FakeEngine:
        def __init__(self) -> None:
            self.next = 1
            self.added: list[int] = []

        def stats(self) -> dict:
            return {}

        def add_request(self, prompt, params):
            if params == "bad":
                raise ValueError("bad params")
            rid, self.next = self.next, self.next + 1
            self.added.append(rid)
            return rid

        def abort(self, rid: int) -> None:
            pass

    async def main() -> None:
        fake = FakeEngine()
        engine = AsyncEngine(fake, asyncio.get_running_loop())
        samples = engine.add_samples([1, 2], ["ok", "ok", "bad"])
        # The leader finishes at once (as a rejected prompt would): its followers start then.
        engine._dispatch([Out(samples[0][0], [7], "stop")])
        assert fake.added == [1, 2]
        await asyncio.sleep(0)
        assert samples[1][0] < 0 and engine._resolve(samples[1][0]) == 2
        bad_q = samples[2][1]
        err = await asyncio.wait_for(bad_q.get(), 1)
        assert isinstance(err, SampleNotStarted) and "bad params" in str(err)

    asyncio.run(main())
