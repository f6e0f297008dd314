"""Integrations with agent frameworks: each takes the framework's own types and keeps its contract.

`agents/` (the OpenAI Agents SDK's `Session`) and `langchain/` (LangChain's
chat message history) share `_items`, which reaches a convmem session in
process or through the service (what both sides compute alike is
`convmem.adapters.frontends._views`, which the service uses too).
`penguiflow/` is PenguiFlow's short-term memory kept in convmem's log (its
public face is `convmem.penguiflow`).
"""
