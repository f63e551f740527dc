"""The OpenAI-compatible HTTP server (`resident serve`): FastAPI over the AsyncEngine.

    from engine.server.app import create_app
    from engine.server.served_model import ServedModel
    app = create_app(async_engine, ServedModel.from_engine(async_engine, "my-model"), api_key=None)

Module map: protocol (request models), app (routes), chat_rendering (an
OpenAI request onto engine.rendering, the one chat renderer),
chat_completions and completions (the two generation routes),
anthropic_* (/v1/messages) and responses* (/v1/responses), translated into
the chat pipeline, generation (engine requests per API request, disconnects),
streaming (SSE), logprobs, request_sampling (SamplingParams and the context check),
error_responses, auth, metrics, served_model, context, options (what `resident
serve` takes) and launch (the CLI command),
background (a server in a thread, for tests and benchmarks).
"""
