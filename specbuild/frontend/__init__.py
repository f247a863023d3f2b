"""The OpenAI-compatible HTTP frontend of a served repository (`specbuild serve --openai-port N`).

Its own layer, above serve/ and client/: it is a server process (an HTTP app, started by `serve`) and a
client of the local tritonserver (it sends every request to the BLS with the gRPC client's request
tensors), and serve/ and client/ do not import each other. schema.py: the request and response bodies
as pydantic models (also the /openapi.json document); protocol.py: a body validated into a request,
bounded errors, the response shapes; chat.py: chat templates; triton.py: the asyncio bridge to Triton;
app.py: the FastAPI routes; run.py: uvicorn in a thread.
"""
