"""The OpenAI frontend's request checks and stop-string handling, without a server."""

from __future__ import annotations

import pytest

from specbuild.frontend.protocol import OpenAIError, StopText, parse_chat, parse_completion


def test_completion_fields_are_honoured_or_refused():
    r = parse_completion(
        {
            "model": "m",
            "prompt": ["hi"],
            "max_tokens": 5,
            "temperature": 0,
            "stop": "x",
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "num_draft_tokens": 0,
            "n": 1,
            "logprobs": None,
            "user": "u",
            "top_k": -1,
        },
        "m",
        100,
    )
    assert (r.prompt, r.max_tokens, r.temperature, r.stop, r.num_draft_tokens, r.top_k) == (
        "hi",
        5,
        0.0,
        ("x",),
        0,
        0,
    )
    assert r.include_usage and r.continuous_usage
    assert parse_completion({"model": "m", "prompt": "hi"}, "m", None).max_tokens == 16  # vLLM's default
    # continuous usage needs include_usage (vLLM's should_include_usage)
    r = parse_completion(
        {"model": "m", "prompt": "p", "stream": True, "stream_options": {"continuous_usage_stats": True}},
        "m",
        None,
    )
    assert not r.include_usage and not r.continuous_usage
    refused = [
        ({"logprobs": 3}, "logprobs"),
        ({"n": 2}, "n"),
        ({"frequency_penalty": 0.1}, "frequency_penalty"),
        ({"guided_json": {}}, "guided_json"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"max_tokens": 100}, "max_tokens"),  # over the engines' limit (100 total tokens)
        ({"temperature": float("nan")}, "temperature"),
        ({"stop": ["a"] * 5}, "stop"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
        ({"num_draft_tokens": -1}, "num_draft_tokens"),
    ]
    for extra, param in refused:
        with pytest.raises(OpenAIError) as err:
            parse_completion({"model": "m", "prompt": "p", **extra}, "m", 100)
        assert err.value.status == 400 and err.value.param == param, extra
        assert err.value.body()["error"]["type"] == "invalid_request_error"
    with pytest.raises(OpenAIError) as err:
        parse_completion({"model": "other", "prompt": "p"}, "m", None)
    assert err.value.status == 404 and err.value.code == "model_not_found"


def test_chat_messages_and_template():
    seen = []

    def render(messages):
        seen.append(messages)
        return "rendered"

    r = parse_chat(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            ],
            "max_completion_tokens": 3,
        },
        "m",
        None,
        render,
    )
    assert r.prompt == "rendered" and r.max_tokens == 3 and seen == [[{"role": "user", "content": "ab"}]]
    for body in (
        {"messages": []},
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
    ):
        with pytest.raises(OpenAIError):
            parse_chat({"model": "m", **body}, "m", None, render)


def test_stop_text_holds_back_a_possible_stop_and_cuts_before_it():
    s = StopText(("END",))
    assert s.push("abc E") == "abc"  # " E" could start END
    assert s.push("N") == " "  # "EN" still could
    assert s.push("Dzzz") == "" and s.stopped
    assert s.push("more") == "" and s.flush() == ""
    t = StopText(("xy",))
    assert t.push("ax") == "a" and t.push("b") == "x" and t.flush() == "b"
    assert StopText(()).push("anything") == "anything"
