"""The official openai and anthropic SDKs, unmodified, against a gateway in front of real
llama.cpp servers: real completions, streaming and not. Only the base URL changes.

Usage: sdk_real.py GATEWAY_URL MODEL
Prints one line per check, then `served <node> ...` (the X-Fleet-Node of each request, in
order) and exits non-zero on the first failure.
"""
import sys

import anthropic
import openai

base, model = sys.argv[1], sys.argv[2]
served = []


def check(name, cond, detail=""):
    print(f"{'ok' if cond else 'FAIL'} {name} {detail}", flush=True)
    if not cond:
        sys.exit(1)


oa = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
raw = oa.chat.completions.with_raw_response.create(
    model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=6
)
c = raw.parse()
served.append(raw.headers.get("x-fleet-node"))
check("openai.chat", bool(c.choices[0].message.content), repr(c.choices[0].message.content))
check("openai.chat.usage", c.usage.prompt_tokens > 0 and c.usage.completion_tokens > 0, str(c.usage))

raw = oa.chat.completions.with_raw_response.create(
    model=model, messages=[{"role": "user", "content": "Name a color."}], max_tokens=6, stream=True
)
served.append(raw.headers.get("x-fleet-node"))
chunks = list(raw.parse())
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
check("openai.chat.stream", len(chunks) >= 2 and bool(text), f"{len(chunks)} chunks {text!r}")

an = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=120)
raw = an.messages.with_raw_response.create(
    model=model, max_tokens=6, messages=[{"role": "user", "content": "Say hi."}]
)
served.append(raw.headers.get("x-fleet-node"))
msg = raw.parse()
check(
    "anthropic.messages",
    bool(msg.content and msg.content[0].text) and msg.stop_reason is not None,
    repr(msg.content[0].text if msg.content else None),
)
with an.messages.stream(
    model=model, max_tokens=6, messages=[{"role": "user", "content": "Name a fruit."}]
) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
    served.append(s.response.headers.get("x-fleet-node"))
check("anthropic.messages.stream", bool(streamed) and final.usage.output_tokens > 0, repr(streamed))
print("served " + " ".join(str(n) for n in served))
print("all real SDK checks passed")
