"""The official SDKs against a gateway whose only node speaks another protocol.

Usage: translated.py GATEWAY_URL MODEL EMBED_MODEL openai-node|ollama-node
openai-node: the node speaks only OpenAI (like llama.cpp): the ollama SDK, the anthropic SDK
and the openai SDK's Responses API are translated. ollama-node: the node speaks only Ollama:
the openai SDK's chat, completions and embeddings are translated.
Prints one line per check and exits non-zero on the first failure.
"""
import sys

import anthropic
import ollama
import openai

base, model, embed_model, mode = sys.argv[1:5]


def check(name, cond, detail=""):
    print(f"{'ok' if cond else 'FAIL'} {name} {detail}", flush=True)
    if not cond:
        sys.exit(1)


if mode == "openai-node":
    ol = ollama.Client(host=base)
    r = ol.chat(model=model, messages=[{"role": "user", "content": "Hi"}])
    check("ollama.chat", bool(r.message.content) and r.done and r.eval_count > 0, repr(r.message.content))
    parts = list(ol.chat(model=model, messages=[{"role": "user", "content": "Hi"}], stream=True))
    text = "".join(p.message.content for p in parts)
    check("ollama.chat.stream", len(parts) > 2 and parts[-1].done and text == r.message.content, f"{len(parts)} parts")
    g = ol.generate(model=model, prompt="Once upon a time", options={"num_predict": 3})
    check("ollama.generate", g.done_reason == "length" and len(g.response.split()) == 3, repr(g.response))
    gs = list(ol.generate(model=model, prompt="Once upon a time", stream=True))
    check("ollama.generate.stream", len(gs) > 2 and gs[-1].done, f"{len(gs)} parts")
    e = ol.embed(model=embed_model, input=["a", "b"])
    check("ollama.embed", len(e.embeddings) == 2 and len(e.embeddings[0]) > 0, str(len(e.embeddings)))
    try:
        ol.chat(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        check("ollama.not_found", False)
    except ollama.ResponseError as err:
        check("ollama.not_found", err.status_code == 404, str(err))

    an = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    msg = an.messages.create(model=model, max_tokens=4, system="Be brief.",
                             messages=[{"role": "user", "content": "Hi"}])
    check("anthropic.messages", msg.content[0].text != "" and msg.stop_reason == "max_tokens"
          and msg.usage.output_tokens == 4, repr(msg.content[0].text))
    with an.messages.stream(model=model, max_tokens=4, system="Be brief.", messages=[{"role": "user", "content": "Hi"}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check("anthropic.messages.stream", streamed == msg.content[0].text and final.stop_reason == "max_tokens",
          repr(streamed))
    try:
        an.messages.create(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "x"}])
        check("anthropic.not_found", False)
    except anthropic.NotFoundError as err:
        check("anthropic.not_found", err.status_code == 404, str(err.body))

    oa = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    resp = oa.responses.create(model=model, instructions="Be brief.", input="Hi")
    check("openai.responses", resp.status == "completed" and resp.output_text != "", repr(resp.output_text))
    events = list(oa.responses.create(model=model, input="Hi", stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check("openai.responses.stream", events[-1].type == "response.completed" and deltas
          and events[-1].response.output_text == deltas, f"{len(events)} events")
    try:
        oa.responses.create(model=model, input="more", previous_response_id=resp.id)
        check("openai.responses.stateless", False)
    except openai.BadRequestError as err:
        check("openai.responses.stateless", "previous_response_id" in str(err.body), str(err.body))
elif mode == "ollama-node":
    oa = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    c = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello"}], max_tokens=8)
    check("openai.chat", bool(c.choices[0].message.content) and c.usage.completion_tokens > 0,
          repr(c.choices[0].message.content))
    chunks = list(oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello"}],
                                             max_tokens=8, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check("openai.chat.stream", len(chunks) > 2 and text == c.choices[0].message.content, f"{len(chunks)} chunks")
    comp = oa.completions.create(model=model, prompt="Once", max_tokens=2)
    check("openai.completions", comp.choices[0].finish_reason == "length", repr(comp.choices[0].text))
    emb = oa.embeddings.create(model=embed_model, input=["a", "b"])
    check("openai.embeddings", len(emb.data) == 2 and len(emb.data[1].embedding) > 0, str(len(emb.data)))
else:
    sys.exit(f"unknown mode {mode}")
print("all SDK checks passed")
