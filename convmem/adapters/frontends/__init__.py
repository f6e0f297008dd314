"""Front ends: what uses the runtime and offers it to callers (the service, the CLI, integrations, connect).

`service/` (the NATS request/reply API and its clients), `cli/` (the
`convmem` command), `integrations/` (PenguiFlow, the OpenAI Agents SDK,
LangChain); beside them `_connect` (`connect()`, which opens a back end by
its URL and builds the system on it) and `_views` (what the integrations'
sessions and the service compute alike). A front end reaches a back end only
through its package's names (`convmem.adapters.backends`,
`convmem.adapters.backends.jetstream`, ...), never its private modules
(`tests/test_layers.py`). The public names are `convmem.adapters`'s.
"""
