"""Drive the gateway with the official, unmodified SDKs; only the base URL changes.

Usage: clients.py GATEWAY_URL MODEL
Prints one line per check and exits non-zero on the first failure.
"""
import sys

import anthropic
import ollama
import openai

base, model = sys.argv[1], sys.argv[2]


def check(name, cond, detail=""):
    print(f"{'ok' if cond else 'FAIL'} {name} {detail}", flush=True)
    if not cond:
        sys.exit(1)


oa = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

resp = oa.chat.completions.with_raw_response.create(
    model=model, messages=[{"role": "user", "content": "Say hello"}], max_tokens=8
)
completion = resp.parse()
check("openai.chat", bool(completion.choices[0].message.content), repr(completion.choices[0].message.content))
check("openai.chat.usage", completion.usage.completion_tokens > 0, str(completion.usage))
check("openai.chat.header", resp.headers.get("x-fleet-served-model") == model, resp.headers.get("x-fleet-node"))

chunks = list(
    oa.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Stream it"}], max_tokens=8, stream=True
    )
)
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check("openai.chat.stream", len(chunks) > 2 and text, f"{len(chunks)} chunks {text!r}")

models = [m.id for m in oa.models.list()]
check("openai.models", model in models, str(models))

try:
    oa.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    check("openai.not_found", False)
except openai.NotFoundError as e:
    check("openai.not_found", e.status_code == 404, str(e.body))

ol = ollama.Client(host=base)
r = ol.chat(model=model, messages=[{"role": "user", "content": "Hi"}])
check("ollama.chat", bool(r["message"]["content"]), repr(r["message"]["content"]))
parts = list(ol.chat(model=model, messages=[{"role": "user", "content": "Hi"}], stream=True))
check("ollama.chat.stream", len(parts) > 2 and parts[-1]["done"], f"{len(parts)} parts")
tags = [m["model"] for m in ol.list()["models"]]
check("ollama.list", model in tags, str(tags))

an = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
msg = an.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
check("anthropic.messages", msg.content[0].text != "" and msg.stop_reason is not None, repr(msg.content[0].text))
with an.messages.stream(model=model, max_tokens=8, messages=[{"role": "user", "content": "Hi"}]) as s:
    streamed = "".join(s.text_stream)
check("anthropic.messages.stream", bool(streamed), repr(streamed))
print("all SDK checks passed")
